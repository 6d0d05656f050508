package index

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// TestPropertyAgainstReference drives the index and the naive reference
// with the same random operations (stores with parents, removals, clears,
// other tiers, resyncs, worker removal, bulk loads) over many workers, a
// third of them sequence-keyed and some switching keying, and
// requires identical answers to random queries. Two writer goroutines own
// disjoint halves of the workers; reader goroutines look up concurrently
// the whole time and check that every answer is well formed. Exact
// comparisons run between phases, while readers keep going.
func TestPropertyAgainstReference(t *testing.T) {
	cases := []struct {
		name   string
		names  int
		ranks  int
		nodes  int
		phases int
		ops    int
		shards int
		allSeq bool // every worker sequence-keyed: the roomy tables
	}{
		{"few-workers", 6, 1, 300, 24, 60, 4, false},
		{"many-workers", 40, 2, 1500, 20, 150, 16, false},
		{"bitmaps", 160, 2, 800, 10, 400, 64, false},
		{"all-seq-keyed", 40, 2, 1500, 20, 150, 16, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			phases := tc.phases
			if testing.Short() {
				phases = max(3, phases/4)
			}
			for seed := uint64(1); seed <= 2; seed++ {
				runProperty(t, seed, tc.names, tc.ranks, tc.nodes, phases, tc.ops, tc.shards, tc.allSeq)
			}
		})
	}
}

func runProperty(t *testing.T, seed uint64, nNames, ranks, nodes, phases, opsPerPhase, shards int, allSeq bool) {
	rng := rand.New(rand.NewPCG(seed, 99))
	u := newUniverse(rng, nodes, 4)
	names := workerNames("w", nNames)
	x := New(Config{Shards: shards})

	// Two writers over disjoint worker names.
	type writer struct {
		g   *gen
		ref *refModel
	}
	writers := []*writer{
		{g: newGen(rand.New(rand.NewPCG(seed, 1)), u, names[:nNames/2], ranks).withSeqKeyed(allSeq), ref: newRef()},
		{g: newGen(rand.New(rand.NewPCG(seed, 2)), u, names[nNames/2:], ranks).withSeqKeyed(allSeq), ref: newRef()},
	}
	refs := []*refModel{writers[0].ref, writers[1].ref}

	// Concurrent readers: well-formedness only (state moves under them).
	stop := make(chan struct{})
	var readers sync.WaitGroup
	var lookups atomic.Int64
	queries := make([][]kvevents.SeqHash, 256)
	qg := newGen(rand.New(rand.NewPCG(seed, 3)), u, names, ranks)
	for i := range queries {
		queries[i] = qg.query()
	}
	for r := 0; r < 2; r++ {
		readers.Add(1)
		go func(r int) {
			defer readers.Done()
			var out Overlaps
			rr := rand.New(rand.NewPCG(seed, uint64(10+r)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if i%64 == 63 {
					runtime.Gosched() // share the two cores with the writers
				}
				q := queries[rr.IntN(len(queries))]
				opt := LookupOptions{EarlyExit: i%3 == 0}
				x.Lookup(q, opt, &out)
				lookups.Add(1)
				seen := map[workerref.Target]bool{}
				best := 0
				for _, w := range out.Workers {
					if seen[w.Key] || w.Blocks < 1 || w.Blocks > len(q) {
						t.Errorf("malformed result %+v for %d hashes", out.Workers, len(q))
						return
					}
					seen[w.Key] = true
					best = max(best, w.Blocks)
				}
				if best != out.Total {
					t.Errorf("total %d, best worker %d", out.Total, best)
					return
				}
			}
		}(r)
	}
	defer func() {
		close(stop)
		readers.Wait()
	}()

	var seq atomic.Uint64
	var out Overlaps
	for phase := 0; phase < phases; phase++ {
		var wg sync.WaitGroup
		for _, w := range writers {
			wg.Add(1)
			go func(w *writer) {
				defer wg.Done()
				for i := 0; i < opsPerPhase; i++ {
					o := w.g.op(w.ref)
					o.applyIndex(x, seq.Add(1))
					o.applyRef(w.ref)
				}
			}(w)
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		checkInvariants(t, x)
		checkWorkerBlocks(t, x, names, ranks)
		for q := 0; q < 60; q++ {
			compareLookup(t, x, refs, qg.query(), qg.options(), &out)
		}
	}
	st := x.Stats()
	if allSeq {
		// Orphans and rebound engine hashes are engine-keyed events; the
		// all-sequence-keyed case has few of them.
		if st.Entries == 0 || st.Rekeyed == 0 || st.UnknownRemovals == 0 || st.DuplicateStores == 0 {
			t.Errorf("workload did not exercise every path: %+v", st)
		}
	} else if st.Entries == 0 || st.BigSets == 0 && nNames > 20 || st.DuplicateStores == 0 || st.UnknownRemovals == 0 ||
		st.IgnoredTier == 0 || st.WorkersRemoved == 0 || st.OrphanStores == 0 || st.ReboundEngineHashes == 0 ||
		st.Rekeyed == 0 {
		t.Errorf("workload did not exercise every path: %+v", st)
	}
	if lookups.Load() == 0 {
		t.Error("readers never ran")
	}
}

// checkWorkerBlocks compares WorkerBlocks with Dump for every key the
// workload can name, known, removed or never seen.
func checkWorkerBlocks(t *testing.T, x *Index, names []string, ranks int) {
	t.Helper()
	dumped := map[workerref.Target]int{}
	for _, d := range x.Dump() {
		dumped[d.Key] = len(d.Blocks)
	}
	for _, name := range names {
		for r := 0; r <= ranks; r++ { // one rank past the workload's
			k := workerref.Target{Worker: name, Rank: uint32(r)}
			if got, want := x.WorkerBlocks(k), dumped[k]; got != want {
				t.Fatalf("WorkerBlocks(%v) = %d, Dump has %d", k, got, want)
			}
		}
	}
}
