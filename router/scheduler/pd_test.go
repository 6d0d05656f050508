package scheduler

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvrouter/kvrouter/workerref"
)

func roled(name string, r Role) WorkerInfo {
	w := wi(name, 0)
	w.Role, w.MaxBatchedTokens = r, 100_000
	return w
}

// Eligibility by role: a prefill-only worker takes prefill legs only; a
// decode-only worker takes decode legs and whole requests; a both worker
// takes anything. A Hard binding on a prefill-only worker cannot hold a
// decode leg (it falls back).
func TestRoleEligibility(t *testing.T) {
	for _, tc := range []struct {
		leg  Leg
		want []string // workers the recording policy may see
	}{
		{LegWhole, []string{"b", "d"}},
		{LegDecode, []string{"b", "d"}},
		{LegPrefill, []string{"b", "p"}},
	} {
		t.Run(tc.leg.String(), func(t *testing.T) {
			p := &recordingPolicy{pick: preferWorker("zzz")}
			h := newHarness(t, Config{}, p, roled("b", RoleBoth), roled("d", RoleDecode), roled("p", RolePrefill))
			h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Leg: tc.leg}))
			seen := p.seen[len(p.seen)-1]
			if len(seen) != len(tc.want) {
				t.Fatalf("candidates %v, want workers %v", seen, tc.want)
			}
			for i, k := range seen {
				if k.Worker != tc.want[i] {
					t.Fatalf("candidates %v, want workers %v", seen, tc.want)
				}
			}
		})
	}
	h := newHarness(t, Config{}, NewDefaultPolicy(0), roled("p", RolePrefill))
	res, _ := h.poll(h.submit(&Request{ID: "r", Tokens: 10}))
	if err := res.err; !errors.Is(err, ErrNoEligibleWorker) {
		t.Fatalf("a whole request on a prefill-only fleet: %v, want ErrNoEligibleWorker", err)
	}
	h = newHarness(t, Config{}, NewDefaultPolicy(0), roled("p", RolePrefill), roled("d", RoleDecode))
	d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Leg: LegDecode, Affinity: hardTo(workerref.Any("p"))}))
	if d.Worker.Worker != "d" || !d.HardFallback {
		t.Fatalf("Hard on a prefill worker, decode leg: %v fallback=%v, want d with fallback", d.Worker, d.HardFallback)
	}
}

// The decode cost prefers the worker holding the prompt (fewer blocks to
// transfer) over an idle one, until its decode load outweighs the
// transfer; it ignores prefill queues elsewhere.
func TestDecodeCost(t *testing.T) {
	hs := hashes(8, 1)
	h := newHarness(t, Config{}, NewDefaultPolicy(0), roled("d1", RoleDecode), roled("d2", RoleDecode))
	held := []Overlap{{Key: wk("d2", 0), Blocks: 8}}
	d := h.admitted(h.submit(&Request{ID: "r1", Tokens: 8 * 16, SeqHashes: hs, Leg: LegDecode, Overlaps: held}))
	if d.Worker.Worker != "d2" {
		t.Fatalf("decode leg went to %v, want d2 (holds the prompt)", d.Worker)
	}
	// Three more requests on d2: 3 active requests outweigh 8 × 0.25 blocks of transfer.
	for _, id := range []string{"x1", "x2", "x3"} {
		h.admitted(h.submit(&Request{ID: id, Tokens: 16, Leg: LegDecode, Pinned: &workerref.Target{Worker: "d2"}}))
	}
	d = h.admitted(h.submit(&Request{ID: "r2", Tokens: 8 * 16, SeqHashes: hs, Leg: LegDecode, Overlaps: held}))
	if d.Worker.Worker != "d1" {
		t.Fatalf("decode leg went to %v, want d1 (d2 has 4 active requests)", d.Worker)
	}
}

// Round robin cycles each leg's candidates on its own: split requests,
// one decode and one prefill selection each, visit every decode and every
// prefill worker (round-robin pairing), not every other one.
func TestRoundRobinPerLeg(t *testing.T) {
	h := newHarness(t, Config{}, RoundRobin{}, roled("p0", RolePrefill), roled("p1", RolePrefill),
		roled("d0", RoleDecode), roled("d1", RoleDecode))
	seen := map[string]int{}
	for i := range 4 {
		for _, leg := range []Leg{LegDecode, LegPrefill} {
			d := h.admitted(h.submit(&Request{ID: leg.String() + string(rune('a'+i)), Tokens: 10, Leg: leg}))
			seen[d.Worker.Worker]++
		}
	}
	for _, w := range []string{"p0", "p1", "d0", "d1"} {
		if seen[w] != 2 {
			t.Fatalf("legs per worker %v, want 2 on each", seen)
		}
	}
}

// Each side of a split request is gated and scored by its own work. A
// decode leg's booking charges its worker no prefill tokens (the decode
// engine pulls the prompt from the prefill leg's engine): decode legs are
// not held in the router queue by prefill the decode worker never runs,
// while their prefill legs wait for a prefill worker. Its prompt blocks
// still count as the decode worker's KV load.
func TestDecodeLegChargesNoPrefill(t *testing.T) {
	d, p := roled("d", RoleDecode), roled("p", RolePrefill)
	d.MaxBatchedTokens, p.MaxBatchedTokens = 100, 100 // busy at 8 × 100 prefill tokens
	h := newHarness(t, Config{Thresholds: DefaultThresholds(), ThresholdsSet: true}, NewDefaultPolicy(0), d, p)
	for i := range 3 {
		h.admitted(h.submit(&Request{ID: fmt.Sprint("r", i), Tokens: 500, SeqHashes: hashes(31, uint64(i)), Leg: LegDecode}))
	}
	l := h.loads()[wk("d", 0)]
	if l.PrefillTokens != 0 || l.DecodeBlocks != 3*32 || l.ActiveRequests != 3 || l.Busy {
		t.Fatalf("decode worker after 3 decode legs of 500 tokens: %+v, want no prefill, 96 decode blocks (31 hashed + 1 partial each), not busy", l)
	}
	// The prefill side is gated by its prefill queue: the second 500-token
	// prefill leg reaches 8 × 100 tokens, the third waits.
	h.admitted(h.submit(&Request{ID: "r0-prefill", Tokens: 500, Leg: LegPrefill, ExpectedOutput: 1}))
	h.admitted(h.submit(&Request{ID: "r1-prefill", Tokens: 500, Leg: LegPrefill, ExpectedOutput: 1}))
	w := h.submit(&Request{ID: "r2-prefill", Tokens: 500, Leg: LegPrefill, ExpectedOutput: 1})
	h.waiting(w)
	if l := h.loads()[wk("p", 0)]; l.PrefillTokens != 1000 || !l.Busy {
		t.Fatalf("prefill worker: %+v, want 1000 prefill tokens, busy", l)
	}
	if l := h.loads()[wk("d", 0)]; l.PrefillTokens != 0 {
		t.Fatalf("decode worker: %+v, want no prefill while its pairs' prefill legs wait", l)
	}
}

// ServeWhole moves a decode leg's prompt tokens onto its worker's prefill
// load (the route ends single: the worker computes the prompt) or off it
// (the route splits); a peer replica mirrors both; prefill_done and free
// then release what is charged, no more.
func TestServeWhole(t *testing.T) {
	clock := newFakeClock()
	var peer *harness
	share := func(ev BookingEvent) {
		if err := peer.s.ApplyRemote(ev); err != nil {
			t.Error(err)
		}
	}
	h := newHarness(t, Config{Replica: "r1", Now: clock.Now, OnBookingChange: share}, NewDefaultPolicy(0), roled("d", RoleDecode), roled("b", RoleBoth))
	peer = newHarness(t, Config{Replica: "r2", Now: clock.Now}, NewDefaultPolicy(0), roled("d", RoleDecode), roled("b", RoleBoth))
	prefill := func(w string) (int, int) {
		return h.loads()[wk(w, 0)].PrefillTokens, peer.loads()[wk(w, 0)].PrefillTokens
	}
	onD := h.admitted(h.submit(&Request{ID: "x", Tokens: 500, Leg: LegDecode, Pinned: new(workerref.Any("d"))}))
	onB := h.admitted(h.submit(&Request{ID: "y", Tokens: 300, Leg: LegDecode, Pinned: new(workerref.Any("b"))}))
	if l, r := prefill("d"); l != 0 || r != 0 {
		t.Fatalf("decode-only worker's decode leg charged %d / %d (peer) prefill tokens, want none", l, r)
	}
	if l, r := prefill("b"); l != 300 || r != 300 {
		t.Fatalf("both worker's decode leg charged %d / %d prefill tokens, want 300 until the route splits", l, r)
	}
	for _, step := range []struct {
		f     Fence
		whole bool
		w     string
		want  int
	}{
		{onD.Fence, true, "d", 500}, {onD.Fence, true, "d", 500}, // repeated: no double charge
		{onB.Fence, false, "b", 0}, {onB.Fence, false, "b", 0},
	} {
		if err := h.s.ServeWhole(step.f, step.whole); err != nil {
			t.Fatal(err)
		}
		if l, r := prefill(step.w); l != step.want || r != step.want {
			t.Fatalf("ServeWhole(%s, %v): %s has %d / %d (peer) prefill tokens, want %d", step.f.RequestID, step.whole, step.w, l, r, step.want)
		}
	}
	if err := h.s.PrefillDone(onD.Fence); err != nil {
		t.Fatal(err)
	}
	if err := h.s.ServeWhole(onD.Fence, true); err != nil {
		t.Fatal(err)
	}
	for _, f := range []Fence{onD.Fence, onB.Fence} {
		if err := h.s.Free(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []string{"d", "b"} {
		if l := h.loads()[wk(w, 0)]; l.PrefillTokens != 0 || l.DecodeBlocks != 0 || l.ActiveRequests != 0 {
			t.Fatalf("%s after free: %+v", w, l)
		}
		if l, r := prefill(w); l != 0 || r != 0 {
			t.Fatalf("%s after free: %d / %d prefill tokens", w, l, r)
		}
	}
}
