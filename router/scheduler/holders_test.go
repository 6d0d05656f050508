package scheduler

import (
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

// The holder table against a map of counts: random adds and decrements
// over few hashes (long probe runs, entries with several holders) and many
// (growth), the reports of add and dec and the holders of every hash
// equal after every step.
func TestHolderTableMatchesMap(t *testing.T) {
	for _, nh := range []int{7, 300, 5000} {
		rnd := rand.New(rand.NewPCG(uint64(nh), 3))
		tb := newHolderTable()
		ref := map[kvevents.SeqHash]map[int32]int32{}
		hashOf := func() kvevents.SeqHash {
			x := kvevents.SeqHash(rnd.IntN(nh))
			if x%2 == 0 {
				x |= 1 << 40 // same low bits as another hash
			}
			return x
		}
		for step := range 40_000 {
			h, slot := hashOf(), int32(rnd.IntN(5))
			if rnd.IntN(2) == 0 {
				want := ref[h][slot] == 0
				if ref[h] == nil {
					ref[h] = map[int32]int32{}
				}
				ref[h][slot]++
				if got := tb.add(h, tb.mix(h), slot); got != want {
					t.Fatalf("hashes %d step %d: add(%d, %d) = %v, want %v", nh, step, h, slot, got, want)
				}
			} else {
				want := ref[h][slot] == 1
				if ref[h][slot] > 0 {
					ref[h][slot]--
					if ref[h][slot] == 0 {
						delete(ref[h], slot)
					}
					if len(ref[h]) == 0 {
						delete(ref, h)
					}
				}
				if got := tb.dec(h, tb.mix(h), slot); got != want {
					t.Fatalf("hashes %d step %d: dec(%d, %d) = %v, want %v", nh, step, h, slot, got, want)
				}
			}
			if tb.len() != len(ref) {
				t.Fatalf("hashes %d step %d: len %d, want %d", nh, step, tb.len(), len(ref))
			}
			if step%97 != 0 {
				continue
			}
			for k := range nh {
				for _, h := range []kvevents.SeqHash{kvevents.SeqHash(k), kvevents.SeqHash(k) | 1<<40} {
					first, more, ok := tb.holdersOf(h)
					if ok != (len(ref[h]) > 0) {
						t.Fatalf("hashes %d step %d: holdersOf(%d) ok %v, want %d holders", nh, step, h, ok, len(ref[h]))
					}
					if !ok {
						continue
					}
					got := map[int32]int32{first.slot: first.n}
					for _, x := range more {
						got[x.slot] = x.n
					}
					if len(got) != len(ref[h]) {
						t.Fatalf("hashes %d step %d: holders of %d %v, want %v", nh, step, h, got, ref[h])
					}
					for s, n := range ref[h] {
						if got[s] != n {
							t.Fatalf("hashes %d step %d: holders of %d %v, want %v", nh, step, h, got, ref[h])
						}
					}
				}
			}
		}
	}
}

// addAll and decAll (a booking's whole prompt, touched ahead in chunks)
// against add and dec one hash at a time on a twin table: the same counts
// reported and the same holders after every batch, with batches that
// repeat hashes, straddle chunks and grow the table midway.
func TestHolderTableBatches(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 8))
	batched, single := newHolderTable(), newHolderTable()
	type booked struct {
		hs   []kvevents.SeqHash
		slot int32
	}
	var live []booked
	for step := range 3000 {
		var b booked
		add := len(live) == 0 || rnd.IntN(5) < 3
		if add {
			b = booked{hs: make([]kvevents.SeqHash, rnd.IntN(3*holderTouch+2)), slot: int32(rnd.IntN(4))}
			for i := range b.hs {
				b.hs[i] = kvevents.SeqHash(rnd.IntN(2000))
			}
			live = append(live, b)
		} else {
			i := rnd.IntN(len(live))
			b = live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		var want, got int64
		for _, h := range b.hs {
			var changed bool
			if add {
				changed = single.add(h, single.mix(h), b.slot)
			} else {
				changed = single.dec(h, single.mix(h), b.slot)
			}
			if changed {
				want++
			}
		}
		if add {
			got = batched.addAll(b.hs, b.slot)
		} else {
			got = batched.decAll(b.hs, b.slot)
		}
		if got != want {
			t.Fatalf("step %d (add %v): %d changed, want %d", step, add, got, want)
		}
		if batched.len() != single.len() {
			t.Fatalf("step %d: len %d, want %d", step, batched.len(), single.len())
		}
	}
	for h := range kvevents.SeqHash(2000) {
		f1, m1, ok1 := batched.holdersOf(h)
		f2, m2, ok2 := single.holdersOf(h)
		if ok1 != ok2 || f1 != f2 || len(m1) != len(m2) {
			t.Fatalf("holders of %d: %v %v %v, want %v %v %v", h, f1, m1, ok1, f2, m2, ok2)
		}
	}
}
