package index

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// overlapsOf returns out's overlaps as a map, checking Total.
func overlapsOf(t *testing.T, out *Overlaps) map[workerref.Target]int {
	t.Helper()
	m := map[workerref.Target]int{}
	total := 0
	for _, w := range out.Workers {
		if _, dup := m[w.Key]; dup {
			t.Fatalf("%v listed twice", w.Key)
		}
		m[w.Key] = w.Blocks
		total = max(total, w.Blocks)
	}
	if out.Total != total {
		t.Fatalf("Total %d, deepest entry %d", out.Total, total)
	}
	return m
}

// TestApproxLookupBisects: workers recorded with prefixes of every length
// class of a 128-block prompt (1, 2, 3, 64, 65, 127 and 128 blocks, and
// two with one depth) get exactly those depths from the predicted index,
// for the prompt, a longer one and a shorter one.
func TestApproxLookupBisects(t *testing.T) {
	clk := testutil.NewClock(time.Unix(0, 0))
	a := NewApprox(ApproxConfig{Clock: clk.Now})
	p := make([]kvevents.SeqHash, 200)
	for i := range p {
		p[i] = seqOf(9, uint64(i))
	}
	depths := map[workerref.Target]int{}
	for i, d := range []int{1, 2, 3, 64, 65, 127, 128, 128, 5, 100} {
		k := workerref.Target{Worker: fmt.Sprintf("w%d", i)}
		depths[k] = d
		a.Record(k, p[:d], clk.Now())
	}
	// Another prompt's blocks in the same table, sharing the first 10.
	a.Record(workerref.Target{Worker: "other"}, append(append([]kvevents.SeqHash{}, p[:10]...), hs(7, 8, 9)...), clk.Now())
	for _, n := range []int{128, 200, 64, 1} {
		want := map[workerref.Target]int{}
		for k, d := range depths {
			want[k] = min(d, n)
		}
		want[workerref.Target{Worker: "other"}] = min(10, n)
		var out Overlaps
		a.Lookup(p[:n], LookupOptions{}, &out)
		if got := overlapsOf(t, &out); fmt.Sprint(sortedOverlaps(got)) != fmt.Sprint(sortedOverlaps(want)) {
			t.Fatalf("prompt of %d blocks:\n got %v\nwant %v", n, sortedOverlaps(got), sortedOverlaps(want))
		}
	}
}

// TestApproxLookupMatchesScan checks the predicted index's bisecting
// Lookup against the block-by-block scan of the same table, after random
// records of prompts' leading blocks (many workers on popular prefixes,
// so that candidates start as bitmaps and end as lists), expiry, worker
// removal and an Allowed filter.
func TestApproxLookupMatchesScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	clk := testutil.NewClock(time.Unix(0, 0))
	a := NewApprox(ApproxConfig{TTL: 10 * time.Second, Clock: clk.Now, Shards: 4})
	u := newUniverse(rng, 400, 2)
	names := workerNames("n", 60)
	var nested, scan Overlaps
	for step := range 6000 {
		k := workerref.Target{Worker: names[rng.IntN(len(names))], Rank: uint32(rng.IntN(2))}
		switch r := rng.IntN(100); {
		case r < 70:
			a.Record(k, u.hashes(u.path(rng.IntN(len(u.seq)), 1+rng.IntN(80))), clk.Now())
		case r < 80:
			clk.Advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
		case r < 81:
			a.RemoveWorker(k.Worker)
		default:
			a.Prune(clk.Now())
			q := u.hashes(u.path(rng.IntN(len(u.seq)), 1+rng.IntN(100)))
			opt := LookupOptions{}
			if rng.IntN(3) == 0 {
				opt.Allowed = func(t workerref.Target) bool { return t.Worker < "n3" }
			}
			a.Lookup(q, opt, &nested)
			a.idx.Lookup(q, opt, &scan)
			got, want := overlapsOf(t, &nested), overlapsOf(t, &scan)
			if fmt.Sprint(sortedOverlaps(got)) != fmt.Sprint(sortedOverlaps(want)) {
				t.Fatalf("step %d, prompt of %d blocks:\n got %v\nwant %v", step, len(q), sortedOverlaps(got), sortedOverlaps(want))
			}
		}
	}
}
