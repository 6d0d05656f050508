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

// TestEngMapIdentity drives an identity-mode table the way Approx does
// (probe, insertProbed, word updates, deleteAt, the zero key) against a Go
// map: the index's view (get, del, each) reports every key as its own
// value, the owner's word survives growth and backward-shift deletion
// (which place keys by the hash bits kept in the word), and the table
// keeps identKeepCap buckets when it empties.
func TestEngMapIdentity(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	m := engMap{ident: true}
	ref := map[uint64]uint32{} // key -> owner
	word := func(k uint64, o uint32) uint64 { return ownerWord(o, mix(k)) }
	for step := 0; step < 200000; step++ {
		k := uint64(rng.IntN(5000))
		h := mix(k)
		o := uint32(rng.IntN(1 << 20))
		switch r := rng.IntN(10); {
		case r < 5 || step < 2000:
			if k == 0 {
				m.put(0, word(0, o))
				ref[0] = o
				break
			}
			at, found := m.probe(k, h)
			if _, ok := ref[k]; found != ok {
				t.Fatalf("step %d: probe(%d) found %v", step, k, found)
			}
			if found {
				m.s[2*at+1] = word(k, o)
			} else {
				m.insertProbed(at, k, h, word(k, o))
			}
			ref[k] = o
		case r < 9:
			_, want := ref[k]
			if k == 0 {
				if _, ok := m.del(0); ok != want {
					t.Fatalf("step %d: del(0) %v", step, ok)
				}
			} else if at, ok := m.probe(k, h); ok != want {
				t.Fatalf("step %d: probe(%d) found %v", step, k, ok)
			} else if ok {
				m.deleteAt(at)
			}
			delete(ref, k)
		default:
			v, ok := m.get(k)
			_, want := ref[k]
			if ok != want || ok && v != k {
				t.Fatalf("step %d: get(%d) = %d,%v", step, k, v, ok)
			}
			w, ok := m.word(k, h)
			if ok && uint32(w) != ref[k] {
				t.Fatalf("step %d: owner of %d is %d, want %d", step, k, uint32(w), ref[k])
			}
		}
		if m.len() != len(ref) {
			t.Fatalf("step %d: len %d want %d", step, m.len(), len(ref))
		}
		if step%10000 == 0 {
			n := 0
			m.each(func(k, v uint64) {
				n++
				if _, ok := ref[k]; !ok || v != k {
					t.Fatalf("each: %d=%d", k, v)
				}
			})
			if n != len(ref) {
				t.Fatalf("each saw %d of %d", n, len(ref))
			}
		}
		if step == 150000 { // drain: the table keeps identKeepCap buckets
			for k := range ref {
				if k == 0 {
					m.del(0)
				} else {
					at, _ := m.probe(k, mix(k))
					m.deleteAt(at)
				}
				delete(ref, k)
			}
			if m.len() != 0 || m.bytes() != 16*identKeepCap {
				t.Fatalf("after drain: len %d bytes %d", m.len(), m.bytes())
			}
		}
	}
}
