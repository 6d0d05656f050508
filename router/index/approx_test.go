package index

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

func hs(vals ...uint64) []kvevents.SeqHash {
	out := make([]kvevents.SeqHash, len(vals))
	for i, v := range vals {
		out[i] = kvevents.SeqHash(v)
	}
	return out
}

var wA, wB = workerref.Target{Worker: "a"}, workerref.Target{Worker: "b"}

func TestApproxTTL(t *testing.T) {
	clk := testutil.NewClock(time.Unix(1000, 0))
	a := NewApprox(ApproxConfig{Clock: clk.Now})
	if a.Config().TTL != DefaultApproxTTL || a.Config().MaxBlocks != 1<<20 || a.Config().PruneTarget != 0.8 {
		t.Fatalf("defaults %+v", a.Config())
	}
	var out Overlaps
	a.Record(wA, hs(1, 2, 3), clk.Now())
	clk.Advance(60 * time.Second)
	a.Record(wB, hs(1, 2), clk.Now())
	a.Lookup(hs(1, 2, 3, 4), LookupOptions{}, &out)
	if out.Get(wA) != 3 || out.Get(wB) != 2 || out.Total != 3 {
		t.Fatalf("fresh: %+v", out)
	}
	// A re-record of block 1 for a restarts its clock only for block 1.
	a.Record(wA, hs(1), clk.Now())
	clk.Advance(60*time.Second - time.Nanosecond) // t = 120s - 1ns
	a.Lookup(hs(1, 2, 3), LookupOptions{}, &out)
	if out.Get(wA) != 3 {
		t.Fatalf("just before TTL: %+v", out)
	}
	clk.Advance(time.Nanosecond) // t = 120s: a's blocks 2 and 3 expire
	a.Lookup(hs(1, 2, 3), LookupOptions{}, &out)
	if out.Get(wA) != 1 || out.Get(wB) != 2 {
		t.Fatalf("at TTL: %+v", out)
	}
	clk.Advance(60 * time.Second) // t = 180s: everything expired
	a.Lookup(hs(1, 2, 3), LookupOptions{}, &out)
	if len(out.Workers) != 0 {
		t.Fatalf("after TTL: %+v", out)
	}
	st := a.Stats()
	if st.Entries != 0 || st.HeapNodes != 0 || st.Expired != 5 || st.Refreshed != 1 || st.Index.Entries != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestApproxRefreshKeepsOneHeapNode(t *testing.T) {
	clk := testutil.NewClock(time.Unix(0, 0))
	a := NewApprox(ApproxConfig{TTL: 10 * time.Second, Clock: clk.Now})
	for i := 0; i < 1000; i++ {
		a.Record(wA, hs(1, 2, 3, 4), clk.Now())
		clk.Advance(time.Second)
	}
	st := a.Stats()
	if st.Entries != 4 || st.HeapNodes != 4 {
		t.Fatalf("hot prefix grew the heap: %+v", st)
	}
	var out Overlaps
	a.Lookup(hs(1, 2, 3, 4), LookupOptions{}, &out)
	if out.Get(wA) != 4 {
		t.Fatalf("%+v", out)
	}
}

func TestApproxCap(t *testing.T) {
	clk := testutil.NewClock(time.Unix(0, 0))
	a := NewApprox(ApproxConfig{MaxBlocks: 100, Clock: clk.Now})
	for i := uint64(0); i < 101; i++ {
		a.Record(wA, hs(1000+i), clk.Now())
		clk.Advance(time.Millisecond)
	}
	st := a.Stats()
	if st.Entries != 80 || st.Evicted != 21 || st.Index.Entries != 80 {
		t.Fatalf("after cap: %+v", st)
	}
	// The oldest went first.
	var out Overlaps
	a.Lookup(hs(1000), LookupOptions{}, &out)
	if len(out.Workers) != 0 {
		t.Fatal("oldest entry survived eviction")
	}
	a.Lookup(hs(1100), LookupOptions{}, &out)
	if out.Get(wA) != 1 {
		t.Fatal("newest entry evicted")
	}
}

func TestApproxRemoveWorker(t *testing.T) {
	clk := testutil.NewClock(time.Unix(0, 0))
	a := NewApprox(ApproxConfig{Clock: clk.Now})
	a.Record(wA, hs(1, 2), clk.Now())
	a.Record(workerref.Target{Worker: "a", Rank: 1}, hs(1), clk.Now())
	a.Record(wB, hs(1), clk.Now())
	a.RemoveWorker("a")
	var out Overlaps
	a.Lookup(hs(1, 2), LookupOptions{}, &out)
	if len(out.Workers) != 1 || out.Get(wB) != 1 {
		t.Fatalf("%+v", out)
	}
	// Recording again after removal works, and stale heap nodes are
	// harmless.
	a.Record(wA, hs(1, 2), clk.Now())
	clk.Advance(DefaultApproxTTL)
	a.Prune(clk.Now())
	if st := a.Stats(); st.Entries != 0 || st.HeapNodes != 0 {
		t.Fatalf("%+v", st)
	}
}

// TestApproxAgainstReference checks random records, time steps, prunes and
// worker removals against a map of deadlines.
func TestApproxAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	clk := testutil.NewClock(time.Unix(0, 0))
	const ttl = 10 * time.Second
	a := NewApprox(ApproxConfig{TTL: ttl, MaxBlocks: 1 << 30, Clock: clk.Now, Shards: 4})
	type key struct {
		k workerref.Target
		h kvevents.SeqHash
	}
	ref := map[key]time.Time{}
	u := newUniverse(rng, 200, 3)
	names := workerNames("n", 6)
	var out Overlaps
	for step := 0; step < 3000; step++ {
		k := workerref.Target{Worker: names[rng.IntN(len(names))], Rank: uint32(rng.IntN(2))}
		switch r := rng.IntN(100); {
		case r < 60:
			h := u.hashes(u.path(rng.IntN(len(u.seq)), 32))
			a.Record(k, h, clk.Now())
			for _, x := range h {
				if d := clk.Now().Add(ttl); d.After(ref[key{k, x}]) {
					ref[key{k, x}] = d
				}
			}
		case r < 90:
			clk.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		case r < 92:
			a.RemoveWorker(k.Worker)
			for kk := range ref {
				if kk.k.Worker == k.Worker {
					delete(ref, kk)
				}
			}
		default:
			a.Prune(clk.Now())
			for kk, d := range ref {
				if !d.After(clk.Now()) {
					delete(ref, kk)
				}
			}
			q := u.hashes(u.path(rng.IntN(len(u.seq)), 40))
			a.Lookup(q, LookupOptions{}, &out)
			want := map[workerref.Target]int{}
			for _, name := range names {
				for rank := uint32(0); rank < 2; rank++ {
					wk := workerref.Target{Worker: name, Rank: rank}
					d := 0
					for d < len(q) {
						if _, ok := ref[key{wk, q[d]}]; !ok {
							break
						}
						d++
					}
					if d > 0 {
						want[wk] = d
					}
				}
			}
			got := map[workerref.Target]int{}
			for _, w := range out.Workers {
				got[w.Key] = w.Blocks
			}
			if fmt.Sprint(sortedOverlaps(got)) != fmt.Sprint(sortedOverlaps(want)) {
				t.Fatalf("step %d:\n got %v\nwant %v", step, sortedOverlaps(got), sortedOverlaps(want))
			}
			if st := a.Stats(); st.Entries != len(ref) || st.HeapNodes < st.Entries {
				t.Fatalf("step %d: entries %d, reference %d, heap %d", step, st.Entries, len(ref), st.HeapNodes)
			}
		}
	}
	checkInvariants(t, a.idx)
}

func TestApproxConcurrent(t *testing.T) {
	clk := testutil.NewClock(time.Unix(0, 0))
	a := NewApprox(ApproxConfig{TTL: time.Second, MaxBlocks: 500, Clock: clk.Now})
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(2)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				a.Record(workerref.Target{Worker: fmt.Sprint(g)}, hs(uint64(i%50), uint64(i%50+1000)), clk.Now())
				if i%100 == 0 {
					clk.Advance(300 * time.Millisecond)
				}
			}
		}(g)
		go func() {
			defer wg.Done()
			var out Overlaps
			for i := 0; i < 2000; i++ {
				a.Lookup(hs(uint64(i%50), uint64(i%50+1000)), LookupOptions{}, &out)
				if out.Total > 2 {
					t.Errorf("total %d", out.Total)
					return
				}
			}
		}()
	}
	wg.Wait()
	if st := a.Stats(); st.Entries > 500 {
		t.Fatalf("cap exceeded: %+v", st)
	}
	checkInvariants(t, a.idx)
}

// TestPredictedCombined is the predict-on-route use: the event-fed index
// knows nothing yet of the routing decision the predicted index records,
// until its TTL (the scheduler takes each worker's larger overlap).
func TestPredictedCombined(t *testing.T) {
	clk := testutil.NewClock(time.Unix(0, 0))
	primary := New(Config{})
	pred := NewApprox(ApproxConfig{TTL: DefaultPredictedTTL, Clock: clk.Now})
	prompt := hs(11, 12, 13, 14)
	primary.ApplyBatch(1, &kvevents.Batch{Worker: "b", Events: []kvevents.Event{{Kind: kvevents.KindStored,
		Blocks: []kvevents.StoredBlock{{Engine: 1, Seq: 11}}}}})
	pred.Record(wA, prompt, clk.Now())
	var out, side Overlaps
	primary.Lookup(prompt, LookupOptions{}, &out)
	pred.Lookup(prompt, LookupOptions{}, &side)
	if out.Get(wA) != 0 || out.Get(wB) != 1 || side.Get(wA) != 4 || side.Get(wB) != 0 || side.Total != 4 {
		t.Fatalf("event-fed %+v, predicted %+v", out, side)
	}
	clk.Advance(DefaultPredictedTTL)
	pred.Lookup(prompt, LookupOptions{}, &side)
	if len(side.Workers) != 0 {
		t.Fatalf("prediction outlived its TTL: %+v", side)
	}
}
