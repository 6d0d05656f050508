package workers

import (
	"bytes"
	"errors"
	"testing"
)

// The role mirrors the engine's own flag; a worker without one writes the
// value it wrote before roles existed and reads back as both.
func TestRole(t *testing.T) {
	for in, want := range map[string]Role{"": RoleBoth, "kv_both": RoleBoth, "kv_producer": RolePrefill,
		"kv_consumer": RoleDecode, "prefill": RolePrefill, "decode": RoleDecode, "null": RoleBoth} {
		if got, err := ParseRole(in); err != nil || got != want {
			t.Errorf("ParseRole(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseRole("kv_sideways"); err == nil {
		t.Error("ParseRole accepted kv_sideways")
	}
	if r, err := RoleFromKVTransferConfig(`{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}`); err != nil || r != RoleDecode {
		t.Errorf("RoleFromKVTransferConfig: %q, %v", r, err)
	}
	if !RolePrefill.Prefills() || RolePrefill.Decodes() || RoleDecode.Prefills() || !Role("").Decodes() {
		t.Error("Prefills/Decodes disagree with the roles")
	}
	plain, err := EncodeInfo(validInfo("w"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(plain, []byte("role")) {
		t.Errorf("a worker without a role writes one: %s", plain)
	}
	i := validInfo("w")
	i.Role, i.BootstrapPort = RolePrefill, 8998
	b, err := EncodeInfo(i)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeInfo(b)
	if err != nil || !got.Equal(i) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	i.Role = "sideways"
	if _, err := EncodeInfo(i); !errors.Is(err, ErrInvalidInfo) {
		t.Fatalf("bad role encoded: %v", err)
	}
}
