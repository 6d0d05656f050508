package scheduler

import (
	"errors"
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
