package index

import (
	"math/rand/v2"
	"testing"
)

// TestEngMapAgainstMap drives engMap and a Go map with the same random
// operations, including the zero key and heavy deletion (shrinking).
func TestEngMapAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	var m engMap
	ref := map[uint64]uint64{}
	for step := 0; step < 200000; step++ {
		k := uint64(rng.IntN(3000)) // small keys: collisions, key 0
		if rng.IntN(100) == 0 {
			k = rng.Uint64()
		}
		switch r := rng.IntN(10); {
		case r < 5 || step < 1000:
			v := rng.Uint64()
			m.put(k, v)
			ref[k] = v
		case r < 9:
			v, ok := m.del(k)
			rv, rok := ref[k]
			if ok != rok || v != rv {
				t.Fatalf("step %d: del(%d) = %d,%v want %d,%v", step, k, v, ok, rv, rok)
			}
			delete(ref, k)
		default:
			v, ok := m.get(k)
			rv, rok := ref[k]
			if ok != rok || v != rv {
				t.Fatalf("step %d: get(%d) = %d,%v want %d,%v", step, k, v, ok, rv, rok)
			}
		}
		if m.len() != len(ref) {
			t.Fatalf("step %d: len %d want %d", step, m.len(), len(ref))
		}
		if step%5000 == 0 {
			n := 0
			m.each(func(k, v uint64) {
				n++
				if ref[k] != v {
					t.Fatalf("each: %d=%d, want %d", k, v, ref[k])
				}
			})
			if n != len(ref) {
				t.Fatalf("each saw %d of %d", n, len(ref))
			}
		}
		if step == 150000 { // drain: the table shrinks
			for k := range ref {
				m.del(k)
				delete(ref, k)
			}
			if m.len() != 0 || m.bytes() > 16*2*engMinCap {
				t.Fatalf("after drain: len %d bytes %d", m.len(), m.bytes())
			}
		}
	}
	m.init(100)
	if m.len() != 0 || m.bytes() < 100*16 {
		t.Fatalf("init: %d %d", m.len(), m.bytes())
	}
}
