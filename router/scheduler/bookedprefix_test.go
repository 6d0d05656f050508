package scheduler

import (
	"slices"
	"strconv"
	"testing"

	"github.com/kvrouter/kvrouter/workerref"
)

// Siblings of a burst: a new 4,096-token prefix no index has seen, each
// with its own 64-token tail, routed back to back. The default counts the
// prefix the first sibling booked as cached on its worker (BookedPrefixCounter).
// At credit 1.25 (sole_holder_credit 0) the second joins it: there
// (4,160 + 4,160)/16 − 1.25·256 = 200 prefill blocks + 0.25·(260 + 260 −
// 256) = 66 decode, 266 against the idle worker's 260 + 65 = 325. Without
// that credit the holder costs 520 + 66 = 586 and the second sibling
// computes the prefix again elsewhere; Dynamo (index overlaps only) does
// the same. The default's sole-holder credit of 1 makes that copy on
// purpose (264 + 66 = 330 against 325), for one sibling: the third finds
// two holders and joins one at 1.25 (TestBookedPrefixSecondCopyOnly).
func TestBookedPrefixKeepsSiblingsTogether(t *testing.T) {
	const prefix, tail = 256, 4
	sibling := func(id string, salt uint64) *Request {
		hs := slices.Concat(hashes(prefix, 1), hashes(tail, salt))
		return &Request{ID: id, Tokens: (prefix + tail) * 16, SeqHashes: hs}
	}
	off, err := NewRegistry().BuildYAML([]byte("name: default\nparams: {count_booked_prefix: false, sole_holder_credit: 0}"))
	if err != nil {
		t.Fatal(err)
	}
	one := NewDefaultPolicy(0)
	one.Cost.SoleHolderCredit = 0
	for _, tc := range []struct {
		name        string
		p           Policy
		together    bool
		wantOverlap int
	}{
		{"default, sole_holder_credit 0", one, true, prefix},
		{"default", NewDefaultPolicy(0), false, 0},
		{"default, count_booked_prefix false", off, false, 0},
		{"dynamo", NewDynamoPolicy(0), false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{}, tc.p, bigWorker("a"), bigWorker("b"))
			d1 := h.admitted(h.submit(sibling("s1", 100)))
			d2 := h.admitted(h.submit(sibling("s2", 101)))
			if got := d1.Worker == d2.Worker; got != tc.together {
				t.Fatalf("siblings on %v and %v, want together=%v", d1.Worker, d2.Worker, tc.together)
			}
			if d2.OverlapBlocks != tc.wantOverlap {
				t.Errorf("second sibling's overlap %d, want %d", d2.OverlapBlocks, tc.wantOverlap)
			}
			// The booking charges the second sibling's uncached tail only
			// when it counts the prefix as cached.
			wantPrefill := (prefix + tail) * 16 // alone on its worker
			if tc.together {
				wantPrefill += tail * 16
			}
			if got := h.loads()[d2.Worker].PrefillTokens; got != wantPrefill {
				t.Errorf("prefill booked on %v: %d tokens, want %d", d2.Worker, got, wantPrefill)
			}
		})
	}
}

// With booked_prefix_only_new a booked prefix counts only where it goes
// deeper than every worker's reported overlap: siblings of a prefix no
// worker reports stay together, siblings of one a worker outside their
// candidates already reports (here c, which they may not use) spread as if
// nothing were booked, and a booked prefix deeper than the reported one
// counts again.
func TestBookedPrefixOnlyNew(t *testing.T) {
	const prefix, tail = 256, 4
	// At one base credit (sole_holder_credit 0): the mechanism alone.
	onlyNew, err := NewRegistry().BuildYAML([]byte("name: default\nparams: {booked_prefix_only_new: true, sole_holder_credit: 0}"))
	if err != nil {
		t.Fatal(err)
	}
	one := NewDefaultPolicy(0)
	one.Cost.SoleHolderCredit = 0
	for _, tc := range []struct {
		name     string
		p        Policy
		reported int // prefix blocks worker c reports
		together bool
	}{
		{"new prefix", onlyNew, 0, true},
		{"reported on c", onlyNew, prefix, false},
		{"reported on c, shallower", onlyNew, prefix / 2, true},
		{"reported on c, the default", one, prefix, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sibling := func(id string, salt uint64) *Request {
				hs := slices.Concat(hashes(prefix, 1), hashes(tail, salt))
				r := &Request{ID: id, Tokens: (prefix + tail) * 16, SeqHashes: hs, Allowed: []string{"a", "b"}}
				if tc.reported > 0 {
					r.Overlaps = []Overlap{{Key: wk("c", 0), Blocks: tc.reported, Reported: tc.reported}}
				}
				return r
			}
			h := newHarness(t, Config{}, tc.p, bigWorker("a"), bigWorker("b"), bigWorker("c"))
			d1 := h.admitted(h.submit(sibling("s1", 100)))
			d2 := h.admitted(h.submit(sibling("s2", 101)))
			if got := d1.Worker == d2.Worker; got != tc.together {
				t.Fatalf("siblings on %v and %v, want together=%v", d1.Worker, d2.Worker, tc.together)
			}
		})
	}
}

// The default's sole-holder credit copies a burst's new prefix once: the
// second sibling goes to an idle worker (TestBookedPrefixKeepsSiblingsTogether),
// and every later sibling finds two holders, whose base credit is 1.25, and
// joins one of them rather than making a third copy.
func TestBookedPrefixSecondCopyOnly(t *testing.T) {
	const prefix, tail = 256, 4
	h := newHarness(t, Config{}, NewDefaultPolicy(0), bigWorker("a"), bigWorker("b"), bigWorker("c"), bigWorker("d"))
	on := map[workerref.Target]int{}
	for i := range 6 {
		hs := slices.Concat(hashes(prefix, 1), hashes(tail, uint64(100+i)))
		d := h.admitted(h.submit(&Request{ID: "s" + strconv.Itoa(i), Tokens: (prefix + tail) * 16, SeqHashes: hs}))
		on[d.Worker]++
	}
	if len(on) != 2 {
		t.Fatalf("six siblings on %d workers (%v), want the prefix and its one copy", len(on), on)
	}
}
