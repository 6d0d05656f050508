package workers

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// manyAdapters returns n sorted distinct names of pad+2 bytes.
func manyAdapters(n, pad int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = string(rune('a'+i/26)) + string(rune('a'+i%26)) + strings.Repeat("x", pad)
	}
	return out
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
