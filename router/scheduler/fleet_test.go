package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Key resolution through the address cache and positional hints stays
// right across copies of names, reorderings, departures and slot reuse.
func TestKeyResolution(t *testing.T) {
	f := newFleet()
	th := &Thresholds{}
	for _, n := range []string{"a", "b"} {
		f.upsert(WorkerInfo{Key: wk(n, 0), Available: true}, th)
	}
	f.upsert(WorkerInfo{Key: wk("b", 70000), Available: true}, th)
	sa, sb := f.lookup("a", 0), f.lookup("b", 0)
	for range 3 {
		for _, tc := range []struct {
			name string
			rank uint32
			want int32
		}{
			{"a", 0, sa}, {strings.Clone("a"), 0, sa}, {"b", 0, sb}, {"a", 1, -1}, {"", 0, -1}, {"zz", 0, -1},
			{"b", 70000, f.lookup("b", 70000)}, {strings.Repeat("x", 70000), 0, -1},
		} {
			if got := f.slotOf(wk(tc.name, tc.rank)); got != tc.want {
				t.Fatalf("slotOf(%.10s/%d) = %d, want %d", tc.name, tc.rank, got, tc.want)
			}
		}
	}
	// Many distinct copies overflow the table: it starts over, still right.
	for i := range 5000 {
		if got := f.slotOf(wk(strings.Clone("b"), 0)); got != sb {
			t.Fatalf("copy %d: %d", i, got)
		}
	}
	// Departure and slot reuse invalidate everything cached.
	a := "a"
	if f.slotOf(wk(a, 0)) != sa {
		t.Fatal("warm")
	}
	f.remove("a", nil)
	if got := f.slotOf(wk(a, 0)); got != -1 {
		t.Fatalf("departed worker resolved to %d", got)
	}
	sc, _ := f.upsert(WorkerInfo{Key: wk("c", 0), Available: true}, th)
	if sc != sa {
		t.Fatalf("slot not reused: %d vs %d", sc, sa)
	}
	if got := f.slotOf(wk(a, 0)); got != -1 {
		t.Fatalf("departed worker resolved to the reused slot %d", got)
	}
	// A miss is not remembered: the worker can join afterwards.
	late := "late"
	if got := f.slotOf(wk(late, 0)); got != -1 {
		t.Fatal(got)
	}
	sl, _ := f.upsert(WorkerInfo{Key: wk("late", 0), Available: true}, th)
	if got := f.slotOf(wk(late, 0)); got != sl {
		t.Fatalf("joined worker resolved to %d, want %d", got, sl)
	}
	// Joins grow the table without emptying it (no quadratic start-up).
	for i := range 3000 {
		f.upsert(WorkerInfo{Key: wk(fmt.Sprint("j", i), 0), Available: true}, th)
	}
	if len(f.cache) < 4*3000 {
		t.Fatalf("cache not grown: %d", len(f.cache))
	}
	if got := f.slotOf(wk(late, 0)); got != sl {
		t.Fatal(got)
	}
}

// Positional hints: the same overlaps in another order, or with other
// string copies, give the same per-slot overlaps.
func TestPositionalHints(t *testing.T) {
	var ws []WorkerInfo
	for i := range 20 {
		ws = append(ws, wi(fmt.Sprint("w", i), 0))
	}
	h := newHarness(t, Config{}, nil, ws...)
	var ovs []Overlap
	for i := range 20 {
		ovs = append(ovs, Overlap{Key: wk(fmt.Sprint("w", i), 0), Blocks: i})
	}
	check := func(ovs []Overlap) {
		t.Helper()
		w := &waiter{req: &Request{ID: "x", Tokens: 1000, Overlaps: ovs}}
		h.c.prepare(w)
		defer h.c.unprepare()
		for _, o := range ovs {
			s := h.c.fl.lookup(o.Key.Worker, 0)
			if got := h.c.cands.ovAt(s); int(got) != o.Blocks {
				t.Fatalf("%s: overlap %d, want %d", o.Key, got, o.Blocks)
			}
		}
	}
	check(ovs)
	check(ovs)
	rev := make([]Overlap, len(ovs))
	for i, o := range ovs {
		rev[len(ovs)-1-i] = Overlap{Key: wk(strings.Clone(o.Key.Worker), 0), Blocks: o.Blocks}
	}
	check(rev)
	check(ovs[5:9])
	// Duplicates keep the largest; the clamp is the prompt's block count.
	w := &waiter{req: &Request{ID: "x", Tokens: 32, Overlaps: []Overlap{{Key: wk("w1", 0), Blocks: 1}, {Key: wk("w1", 0), Blocks: 5}, {Key: wk("w1", 0), Blocks: 2}}}}
	h.c.prepare(w)
	if got := h.c.cands.ovAt(h.c.fl.lookup("w1", 0)); got != 2 {
		t.Fatalf("duplicate/clamp: %d", got)
	}
	h.c.unprepare()
	// One entry per index (the event-fed one with Reported, the predicted
	// one without): the largest of each, each clamped.
	for _, tc := range []struct {
		ovs           []Overlap
		blocks, repor int
	}{
		{[]Overlap{{Key: wk("w1", 0), Blocks: 1, Reported: 1}, {Key: wk("w1", 0), Blocks: 2}}, 2, 1},
		{[]Overlap{{Key: wk("w1", 0), Blocks: 2}, {Key: wk("w1", 0), Blocks: 1, Reported: 1}}, 2, 1},
		{[]Overlap{{Key: wk("w1", 0), Blocks: 9, Reported: 9}, {Key: wk("w1", 0), Blocks: 1}}, 2, 2},
		{[]Overlap{{Key: wk("w1", 0), Blocks: 1}}, 1, 0},
	} {
		w := &waiter{req: &Request{ID: "x", Tokens: 32, Overlaps: tc.ovs}}
		h.c.prepare(w)
		c := &h.c.cands
		c.slots = []int32{h.c.fl.lookup("w1", 0)}
		if b, r := c.OverlapBlocks(0), c.ReportedBlocks(0); b != tc.blocks || r != tc.repor {
			t.Fatalf("%+v: %d blocks, %d reported; want %d, %d", tc.ovs, b, r, tc.blocks, tc.repor)
		}
		h.c.unprepare()
	}
}

// TestRanksKeptInOrder: a worker's slots stay sorted by rank whatever order
// its ranks register in (the sort once read a new slot's rank before it was
// set, so ranks registered high to low came out unsorted).
func TestRanksKeptInOrder(t *testing.T) {
	f := newFleet()
	th := DefaultThresholds()
	for _, r := range []uint32{5, 2, 9, 0, 7} {
		f.upsert(WorkerInfo{Key: wk("w", r), Available: true}, &th)
	}
	w := f.widOf("w")
	var got []uint32
	for _, s := range f.workers[w].slots {
		got = append(got, f.key[s].Rank)
	}
	if !slices.IsSorted(got) || len(got) != 5 {
		t.Fatalf("ranks of w in slot order = %v, want sorted", got)
	}
}
