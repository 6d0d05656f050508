package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

func stored(blocks ...uint64) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.KindStored}
	for _, b := range blocks {
		ev.Blocks = append(ev.Blocks, kvevents.StoredBlock{Engine: kvevents.EngineHash(b + 1<<32), Seq: kvevents.SeqHash(b)})
	}
	return ev
}

func removed(blocks ...uint64) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.KindRemoved}
	for _, b := range blocks {
		ev.Removed = append(ev.Removed, kvevents.EngineHash(b+1<<32))
	}
	return ev
}

func batch(worker string, rank uint32, evs ...kvevents.Event) *kvevents.Batch {
	return &kvevents.Batch{Model: "m", Worker: worker, Rank: rank, Events: evs}
}

func TestApplySemantics(t *testing.T) {
	x := New(Config{Model: "m"})
	var out Overlaps
	look := func(q ...uint64) map[string]int {
		x.Lookup(hs(q...), LookupOptions{}, &out)
		m := map[string]int{}
		for _, w := range out.Workers {
			m[w.Key.String()] = w.Blocks
		}
		return m
	}
	x.ApplyBatch(1, batch("a", 0, stored(1, 2, 3)))
	x.ApplyBatch(2, batch("a", 1, stored(1, 2)))
	x.ApplyBatch(3, batch("b", 0, stored(1), stored(1, 2, 3, 4))) // duplicate of 1 within
	if got := fmt.Sprint(look(1, 2, 3, 4, 5)); got != "map[a#0:3 a#1:2 b#0:4]" {
		t.Fatalf("after stores: %s", got)
	}
	if out.Total != 4 {
		t.Fatalf("total %d", out.Total)
	}
	// Removing block 2 cuts a/0's run at 1 even though it still holds 3.
	x.ApplyBatch(4, batch("a", 0, removed(2, 99)))
	if got := fmt.Sprint(look(1, 2, 3)); got != "map[a#0:1 a#1:2 b#0:3]" {
		t.Fatalf("after removal: %s", got)
	}
	// Other tiers are ignored; Cleared empties one rank only.
	host := stored(7)
	host.Tier = kvevents.TierHost
	hostRm := removed(1)
	hostRm.Tier = kvevents.TierHost
	x.ApplyBatch(5, batch("a", 1, host, hostRm))
	x.ApplyBatch(6, batch("b", 0, kvevents.Event{Kind: kvevents.KindCleared}, kvevents.Event{Kind: 99}))
	if got := fmt.Sprint(look(1, 2)); got != "map[a#0:1 a#1:2]" {
		t.Fatalf("after clear: %s", got)
	}
	if got := fmt.Sprint(look(7)); got != "map[]" {
		t.Fatalf("host-tier block indexed: %s", got)
	}
	// Foreign model and bad batches change nothing but are counted.
	x.ApplyBatch(7, &kvevents.Batch{Model: "other", Worker: "c", Events: []kvevents.Event{stored(1)}})
	x.ApplyBatch(8, nil)
	x.ApplyBatch(9, &kvevents.Batch{Model: "m"})
	x.Resync(kvevents.Signal{Model: "other", Worker: "a"})
	if got := fmt.Sprint(look(1)); got != "map[a#0:1 a#1:1]" {
		t.Fatalf("after foreign input: %s", got)
	}
	// A parent the worker does not hold is counted; the block is indexed.
	orphan := stored(50)
	orphan.HasParent, orphan.Parent = true, 12345
	x.ApplyBatch(10, batch("a", 0, orphan))
	st := x.Stats()
	want := Stats{Workers: 3, Blocks: 4, Entries: 5, StreamSeq: 10, Batches: 7, Events: 10, Stored: 10,
		DuplicateStores: 1, Removed: 1, UnknownRemovals: 1, Cleared: 1, OrphanStores: 1, IgnoredTier: 2,
		ForeignModel: 2, BadEvents: 1, BadBatches: 2}
	st.Bytes, st.BytesPerEntry, st.BigSets = 0, 0, 0
	if st != want {
		t.Fatalf("stats\n got %+v\nwant %+v", st, want)
	}
	checkInvariants(t, x)

	// Resync, ClearWorker, RemoveWorker, LoadWorker.
	x.Resync(kvevents.Signal{Kind: kvevents.SignalNewEpoch, Model: "m", Worker: "a", Rank: 1})
	if got := fmt.Sprint(look(1)); got != "map[a#0:1]" {
		t.Fatalf("after resync: %s", got)
	}
	x.LoadWorker(workerref.Target{Worker: "a", Rank: 1}, []kvevents.StoredBlock{{Engine: 5, Seq: 1}, {Engine: 6, Seq: 2}})
	x.ClearWorker(workerref.Target{Worker: "a"})
	if got := fmt.Sprint(look(1, 2)); got != "map[a#1:2]" {
		t.Fatalf("after load and clear: %s", got)
	}
	x.RemoveWorker("a")
	x.ClearWorker(workerref.Target{Worker: "nobody"})
	x.RemoveWorker("nobody")
	if got := fmt.Sprint(look(1, 2)); got != "map[]" || len(x.Workers()) != 1 {
		t.Fatalf("after remove: %s, workers %v", got, x.Workers())
	}
	checkInvariants(t, x)
}

func TestMultipleEngineHashesForOneBlock(t *testing.T) {
	x := New(Config{})
	k := workerref.Target{Worker: "w"}
	ev := kvevents.Event{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 1, Seq: 100}, {Engine: 2, Seq: 100}, {Engine: 0, Seq: 0}}}
	x.ApplyBatch(1, &kvevents.Batch{Worker: "w", Events: []kvevents.Event{ev}})
	var out Overlaps
	x.Lookup(hs(100), LookupOptions{}, &out)
	if out.Get(k) != 1 {
		t.Fatal("block not held")
	}
	x.ApplyBatch(2, &kvevents.Batch{Worker: "w", Events: []kvevents.Event{{Kind: kvevents.KindRemoved, Removed: []kvevents.EngineHash{1}}}})
	x.Lookup(hs(100), LookupOptions{}, &out)
	if out.Get(k) != 1 {
		t.Fatal("block left with its first engine hash; the second still names it")
	}
	checkInvariants(t, x)
	// Engine hash 1 reused for other content; then 2 leaves: block gone.
	x.ApplyBatch(3, &kvevents.Batch{Worker: "w", Events: []kvevents.Event{
		{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 2, Seq: 200}}},
	}})
	x.Lookup(hs(100), LookupOptions{}, &out)
	if out.Get(k) != 0 {
		t.Fatal("block survived its last engine hash")
	}
	x.Lookup(hs(0, 200), LookupOptions{}, &out) // zero hashes are ordinary values
	if out.Get(k) != 2 {
		t.Fatalf("zero block: %+v", out)
	}
	if st := x.Stats(); st.ReboundEngineHashes != 1 || st.Entries != 2 {
		t.Fatalf("%+v", st)
	}
	checkInvariants(t, x)
}

func TestEntryCaps(t *testing.T) {
	x := New(Config{MaxEntries: 10, MaxEntriesPerWorker: 6})
	var blocks []uint64
	for i := uint64(1); i <= 8; i++ {
		blocks = append(blocks, i)
	}
	x.ApplyBatch(1, batch("a", 0, stored(blocks...)))
	x.ApplyBatch(2, batch("b", 0, stored(blocks...)))
	st := x.Stats()
	// a: 6 (per-worker cap), b: 4 (global cap of 10).
	if st.Entries != 10 || st.RefusedStores != 6 {
		t.Fatalf("%+v", st)
	}
	var out Overlaps
	x.Lookup(hs(blocks...), LookupOptions{}, &out)
	if out.Get(workerref.Target{Worker: "a"}) != 6 || out.Get(workerref.Target{Worker: "b"}) != 4 {
		t.Fatalf("%+v", out)
	}
	// Refused blocks are unknown to their worker: removing them is a
	// harmless unknown removal; removals free room for new stores.
	x.ApplyBatch(3, batch("a", 0, removed(8, 1)))
	x.ApplyBatch(4, batch("b", 0, stored(20)))
	st = x.Stats()
	if st.Entries != 10 || st.UnknownRemovals != 1 || st.RefusedStores != 6 {
		t.Fatalf("%+v", st)
	}
	checkInvariants(t, x)
}

func TestLookupOptionsAndEdges(t *testing.T) {
	x := New(Config{})
	x.ApplyBatch(1, batch("a", 0, stored(1, 2, 3, 4)))
	x.ApplyBatch(2, batch("b", 0, stored(1, 2)))
	var out Overlaps
	x.Lookup(nil, LookupOptions{}, &out)
	if len(out.Workers) != 0 || out.Total != 0 {
		t.Fatal("empty query matched")
	}
	x.Lookup(hs(1, 2, 3, 4), LookupOptions{EarlyExit: true}, &out)
	// b drops out at block 2; a alone remains at depth 3 and the scan stops.
	if !out.EarlyExited || out.Get(workerref.Target{Worker: "a"}) != 3 || out.Get(workerref.Target{Worker: "b"}) != 2 || out.Total != 3 {
		t.Fatalf("early exit: %+v", out)
	}
	onlyB := func(k workerref.Target) bool { return k.Worker == "b" }
	x.Lookup(hs(1, 2, 3, 4), LookupOptions{Allowed: onlyB}, &out)
	if len(out.Workers) != 1 || out.Get(workerref.Target{Worker: "b"}) != 2 || out.Total != 2 {
		t.Fatalf("allowed: %+v", out)
	}
	x.Lookup(hs(1, 2), LookupOptions{Allowed: func(workerref.Target) bool { return false }}, &out)
	if len(out.Workers) != 0 {
		t.Fatal("allowed none matched")
	}
	x.Lookup(hs(9, 1, 2), LookupOptions{}, &out)
	if len(out.Workers) != 0 {
		t.Fatal("a request whose first block nobody holds matched")
	}
}

// TestLookupZeroAlloc: after warm-up, lookups allocate nothing, whether
// candidates are a list or a bitmap.
func TestLookupZeroAlloc(t *testing.T) {
	x := New(Config{})
	prompt := make([]uint64, 128)
	for i := range prompt {
		prompt[i] = uint64(i + 1)
	}
	for w := 0; w < 300; w++ {
		n := 4
		if w%50 == 0 {
			n = 128
		}
		x.ApplyBatch(1, batch(fmt.Sprintf("w%03d", w), 0, stored(prompt[:n]...)))
	}
	q := hs(prompt...)
	var out Overlaps
	for _, opt := range []LookupOptions{{}, {EarlyExit: true}, {Allowed: func(k workerref.Target) bool { return k.Worker[3] != '7' }}} {
		x.Lookup(q, opt, &out)
		if out.Total != 128 {
			t.Fatalf("total %d", out.Total)
		}
		if a := testing.AllocsPerRun(100, func() { x.Lookup(q, opt, &out) }); a != 0 {
			t.Fatalf("%v allocations per lookup", a)
		}
	}
}

// TestSlotReuseNeverResurrects removes and re-adds workers in a loop so
// their slots are reused, while readers check that a worker is never
// credited with blocks only another worker ever held.
func TestSlotReuseNeverResurrects(t *testing.T) {
	x := New(Config{Shards: 4})
	chain := func(base uint64) []uint64 {
		c := make([]uint64, 16)
		for i := range c {
			c[i] = base + uint64(i)
		}
		return c
	}
	ca, cb := chain(1000), chain(2000)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			var out Overlaps
			q := hs(ca...)
			wrong := "b"
			if r == 1 {
				q, wrong = hs(cb...), "a"
			}
			for !stop.Load() {
				x.Lookup(q, LookupOptions{}, &out)
				for _, w := range out.Workers {
					if w.Key.Worker == wrong {
						t.Errorf("worker %s credited with %d blocks it never held", wrong, w.Blocks)
						return
					}
				}
			}
		}(r)
	}
	for i := 0; i < 3000 && !t.Failed(); i++ {
		x.ApplyBatch(1, batch("a", 0, stored(ca...)))
		x.RemoveWorker("a")
		x.ApplyBatch(2, batch("b", 0, stored(cb...)))
		x.RemoveWorker("b")
	}
	stop.Store(true)
	wg.Wait()
	checkInvariants(t, x)
	if x.nextSlot > 2 {
		t.Fatalf("slots were not reused: %d allocated", x.nextSlot)
	}
}

// TestSlotReuseNeverBlends hands one slot back and forth between two
// workers holding different lengths of one prompt, while readers look the
// prompt up: a scan that saw the slot under both owners must not credit
// the shorter holder with the longer one's blocks. Lookup's rerun when a
// slot was assigned during its scan is what keeps this; without it the
// test fails.
func TestSlotReuseNeverBlends(t *testing.T) {
	x := New(Config{Shards: 4})
	long := make([]uint64, 256)
	for i := range long {
		long[i] = 5000 + uint64(i)
	}
	const short = 8
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out Overlaps
			q := hs(long...)
			for !stop.Load() {
				x.Lookup(q, LookupOptions{}, &out)
				for _, w := range out.Workers {
					if w.Key.Worker == "short" && w.Blocks > short {
						t.Errorf("worker short credited with %d blocks; it only ever held %d", w.Blocks, short)
						return
					}
				}
			}
		}()
	}
	for i := 0; i < 4000 && !t.Failed(); i++ {
		x.ApplyBatch(1, batch("short", 0, stored(long[:short]...)))
		x.RemoveWorker("short")
		x.ApplyBatch(2, batch("long", 0, stored(long...)))
		x.RemoveWorker("long")
	}
	stop.Store(true)
	wg.Wait()
	checkInvariants(t, x)
}

func TestBigSetTransitions(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, universe := range []int{40, 1000, 10000} {
		ref := map[uint32]bool{}
		var b *bigSet
		for step := 0; step < 20000; step++ {
			s := uint32(rng.IntN(universe))
			switch {
			case b == nil:
				members := []uint32{s, s + 1, s + 2, s + 3}
				b = newBigSet(7, members)
				clear(ref)
				for _, m := range members {
					ref[m] = true
				}
			case !ref[s] && (rng.IntN(2) == 0 || len(ref) < 5):
				b = b.with(s)
				ref[s] = true
			case ref[s]:
				b = b.without(s)
				delete(ref, s)
			}
			if b.n != len(ref) {
				t.Fatalf("n %d, want %d", b.n, len(ref))
			}
			if len(ref) <= inlineCap {
				b = nil
				continue
			}
			probe := uint32(rng.IntN(universe + 64))
			if b.has(probe) != ref[probe] {
				t.Fatalf("has(%d) = %v", probe, b.has(probe))
			}
			if step%500 == 0 {
				got := b.appendSlots(nil)
				if !slices.IsSorted(got) || len(got) != len(ref) {
					t.Fatalf("slots %v", got)
				}
				for _, m := range got {
					if !ref[m] {
						t.Fatalf("stray member %d", m)
					}
				}
			}
		}
	}
	// Bitmaps appear once a set is dense and go back to lists.
	var members []uint32
	for i := uint32(0); i < 2000; i++ {
		members = append(members, i)
	}
	b := newBigSet(7, members)
	if b.bits == nil {
		t.Fatal("2000 of 2000 slots is not a bitmap")
	}
	for i := uint32(0); i < 1990; i++ {
		b = b.without(i)
	}
	if b.bits != nil || b.n != 10 || !b.has(1995) || b.has(5) {
		t.Fatalf("10 of 2000 slots is still a bitmap: %+v", b)
	}
}

func TestTableShrinksAndStats(t *testing.T) {
	x := New(Config{Shards: 2})
	var blocks []uint64
	for i := uint64(0); i < 20000; i++ {
		blocks = append(blocks, i)
	}
	x.ApplyBatch(1, batch("a", 0, stored(blocks...)))
	x.ApplyBatch(1, batch("b", 0, stored(blocks[:10]...)))
	big := x.Stats()
	if big.Entries != 20010 || big.Blocks != 20000 || big.BytesPerEntry < 16 || big.BytesPerEntry > 200 {
		t.Fatalf("%+v", big)
	}
	x.ClearWorker(workerref.Target{Worker: "a"})
	x.ApplyBatch(1, batch("b", 0, removed(blocks[:10]...)))
	small := x.Stats()
	if small.Entries != 0 || small.Blocks != 0 || small.Bytes*10 > big.Bytes {
		t.Fatalf("after clearing: %+v (was %d bytes)", small, big.Bytes)
	}
	checkInvariants(t, x)
}

// SetWorkerLimit caps one worker's ranks below MaxEntriesPerWorker, on
// ranks that exist and ranks created later; RemoveWorker forgets it.
func TestSetWorkerLimit(t *testing.T) {
	x := New(Config{MaxEntriesPerWorker: 6})
	var blocks []uint64
	for i := uint64(1); i <= 8; i++ {
		blocks = append(blocks, i)
	}
	x.ApplyBatch(1, batch("a", 0, stored(1)))
	x.SetWorkerLimit("a", 3)
	x.SetWorkerLimit("b", 100) // above the config's cap: the config's wins
	x.ApplyBatch(2, batch("a", 0, stored(blocks...)))
	x.ApplyBatch(3, batch("a", 1, stored(blocks...))) // a new rank of a
	x.ApplyBatch(4, batch("b", 0, stored(blocks...)))
	for _, c := range []struct {
		k    workerref.Target
		want int
	}{{workerref.Target{Worker: "a"}, 3}, {workerref.Target{Worker: "a", Rank: 1}, 3}, {workerref.Target{Worker: "b"}, 6}} {
		if got := x.WorkerBlocks(c.k); got != c.want {
			t.Errorf("%v holds %d blocks, want %d", c.k, got, c.want)
		}
	}
	if st := x.Stats(); st.RefusedStores != 5+5+2 {
		t.Fatalf("refused %d stores, want 12", st.RefusedStores)
	}
	x.RemoveWorker("a")
	x.ApplyBatch(5, batch("a", 0, stored(blocks...)))
	if got := x.WorkerBlocks(workerref.Target{Worker: "a"}); got != 6 {
		t.Fatalf("a holds %d blocks after it left and came back, want the config's cap 6", got)
	}
	checkInvariants(t, x)
}

// TestLookupDropsASlotThatChangedHands hands a worker's slot to another
// worker in the middle of a lookup (from its Allowed callback, which runs
// during the scan): the new owner holds the same blocks, so only the
// lookup's final check can tell that the entry it recorded for the old
// owner is stale.
func TestLookupDropsASlotThatChangedHands(t *testing.T) {
	x := New(Config{Shards: 4})
	ca := make([]uint64, 16)
	for i := range ca {
		ca[i] = 5000 + uint64(i)
	}
	x.ApplyBatch(1, batch("a", 0, stored(ca...)))
	var out Overlaps
	calls := 0
	x.Lookup(hs(ca...), LookupOptions{Allowed: func(k workerref.Target) bool {
		if calls++; calls == 1 {
			x.RemoveWorker("a")
			x.ApplyBatch(2, batch("b", 0, stored(ca...)))
		}
		return true
	}}, &out)
	if x.nextSlot != 1 {
		t.Fatalf("b did not take a's slot: %d slots allocated", x.nextSlot)
	}
	for _, w := range out.Workers {
		if w.Key.Worker == "a" {
			t.Fatalf("a, removed during the lookup, credited with %d blocks its slot's new owner holds", w.Blocks)
		}
	}
	// The next lookup sees b.
	x.Lookup(hs(ca...), LookupOptions{}, &out)
	if len(out.Workers) != 1 || out.Workers[0].Key.Worker != "b" || out.Workers[0].Blocks != 16 {
		t.Fatalf("after: %+v, want b with 16 blocks", out.Workers)
	}
}
