package workers

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestAdapterListsValidate(t *testing.T) {
	long := make([]string, MaxAdapters+1)
	for i := range long {
		long[i] = strings.Repeat("a", 3) + string(rune('A'+i/26)) + string(rune('a'+i%26))
	}
	big := make([]string, 100)
	for i := range big {
		big[i] = string(rune('a'+i/26)) + string(rune('a'+i%26)) + strings.Repeat("x", 200)
	}
	tests := []struct {
		name  string
		mod   func(*Info)
		field string // "" = valid
	}{
		{"none", func(*Info) {}, ""},
		{"served and loaded", func(i *Info) { i.Adapters, i.LoadedAdapters, i.MaxLoRAs = []string{"a", "b"}, []string{"b"}, 2 }, ""},
		{"loaded not served", func(i *Info) { i.LoadedAdapters = []string{"x"} }, ""},
		{"unsorted", func(i *Info) { i.Adapters = []string{"b", "a"} }, "adapters"},
		{"duplicate", func(i *Info) { i.LoadedAdapters = []string{"a", "a"} }, "loaded_adapters"},
		{"empty name", func(i *Info) { i.Adapters = []string{""} }, "adapters"},
		{"control", func(i *Info) { i.Adapters = []string{"a\tb"} }, "adapters"},
		{"too many", func(i *Info) { i.Adapters = SortAdapters(long[:MaxAdapters]); i.Adapters = append(i.Adapters, "zzz") }, "adapters"},
		{"too many bytes", func(i *Info) { i.Adapters = big }, "adapters"},
		{"negative max", func(i *Info) { i.MaxLoRAs = -1 }, "max_loras"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := validInfo("w1")
			tc.mod(&in)
			err := in.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ie *InfoError
			if !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("Validate = %v, want an InfoError on %q", err, tc.field)
			}
		})
	}
}

// A worker without adapters writes exactly what it wrote before adapters
// existed (no new keys), and a value with them round-trips.
func TestAdapterListsOnTheWire(t *testing.T) {
	plain, err := EncodeInfo(validInfo("w1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"adapters", "loaded_adapters", "max_loras"} {
		if bytes.Contains(plain, []byte(`"`+k+`"`)) {
			t.Errorf("a worker without adapters writes %q: %s", k, plain)
		}
	}
	in := validInfo("w1")
	in.Adapters, in.LoadedAdapters, in.MaxLoRAs = []string{"sql", "zh"}, []string{"zh"}, 2
	val, err := EncodeInfo(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeInfo(val)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Equal(in) || !out.ServesAdapter("sql") || out.ServesAdapter("x") || !out.AdapterLoaded("zh") || out.AdapterLoaded("sql") {
		t.Fatalf("round trip: %+v", out)
	}
	c := in.Clone()
	c.Adapters[0] = "changed"
	if in.Adapters[0] != "sql" || in.Equal(c) {
		t.Fatal("Clone shares the adapter list, or Equal misses a change in it")
	}
}

func TestSortAdapters(t *testing.T) {
	got := SortAdapters([]string{"b", "", "a", "b"})
	if strings.Join(got, ",") != "a,b" {
		t.Fatalf("SortAdapters = %q", got)
	}
	if SortAdapters([]string{""}) != nil {
		t.Fatal("SortAdapters of nothing is not nil")
	}
}

// SetAdapters writes at once and routers see an update; an unchanged call
// writes nothing; the lists survive heartbeats.
func TestSetAdapters(t *testing.T) {
	_, js := setup(t)
	cfg := testCfg()
	m, rec, reg := watchAndRegisterW1(t, js, cfg)
	if err := reg.SetAdapters(ctxT(t), []string{"b", "a"}, []string{"b"}, 2); err != nil {
		t.Fatal(err)
	}
	e := rec.wait(t, "update", "w1", time.Second)
	if strings.Join(e.info.Adapters, ",") != "a,b" || !e.info.AdapterLoaded("b") || e.info.MaxLoRAs != 2 {
		t.Fatalf("update %+v", e.info)
	}
	rev := reg.Revision()
	if err := reg.SetAdapters(ctxT(t), []string{"a", "b"}, []string{"b"}, 2); err != nil {
		t.Fatal(err)
	}
	if reg.Revision() != rev {
		t.Fatal("an unchanged SetAdapters wrote the key")
	}
	rec.none(t, "update", "w1", 2*testHeartbeat)
	if i, _ := m.Get("w1"); !i.ServesAdapter("a") {
		t.Fatalf("adapters lost after heartbeats: %+v", i)
	}
	if err := reg.SetAdapters(ctxT(t), []string{"a"}, nil, 2); err != nil {
		t.Fatal(err)
	}
	if e := rec.wait(t, "update", "w1", time.Second); e.info.AdapterLoaded("b") || e.info.ServesAdapter("b") {
		t.Fatalf("update %+v", e.info)
	}
}
