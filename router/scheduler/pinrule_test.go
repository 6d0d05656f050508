package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

func hardTo(t workerref.Target) *Affinity { return &Affinity{Target: t, Mode: session.Hard} }
func softTo(t workerref.Target) *Affinity { return &Affinity{Target: t, Mode: session.Soft} }

// A custom policy that always prefers worker b is limited to the eligible
// Hard target, and sees only the target's rows.
func TestHardAffinityLimitsACustomPickerToTheEligibleTarget(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target workerref.Target
		seen   []workerref.Target
		want   workerref.Target
	}{
		{"ranked", workerref.Of("a", 1), []workerref.Target{wk("a", 1)}, wk("a", 1)},
		{"worker-only", workerref.Any("a"), []workerref.Target{wk("a", 0), wk("a", 1)}, wk("a", 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &recordingPolicy{pick: preferWorker("b")}
			h := newHarness(t, Config{}, p, wi("a", 0), wi("a", 1), wi("b", 0))
			d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Affinity: hardTo(tc.target)}))
			if d.Worker != tc.want || d.HardFallback {
				t.Fatalf("got %v fallback=%v, want %v", d.Worker, d.HardFallback, tc.want)
			}
			if !slices.Equal(p.seen[0], tc.seen) {
				t.Fatalf("policy saw %v, want %v", p.seen[0], tc.seen)
			}
			if p.affinity[0] != nil {
				t.Fatalf("a Hard target must not reach the policy as a Soft one: %v", p.affinity[0])
			}
		})
	}
}

// The default selector is limited to the eligible Hard target even when
// another worker is far cheaper, with and without sampling.
func TestHardAffinityLimitsTheDefaultSelectorToAnEligibleTarget(t *testing.T) {
	for _, temp := range []float64{0, 0.7} {
		t.Run(fmt.Sprint("T=", temp), func(t *testing.T) {
			h := newHarness(t, Config{}, NewDefaultPolicy(temp), wi("a", 0), wi("b", 0), wi("c", 0))
			for i := range 50 {
				r := &Request{ID: fmt.Sprint("r", i), Tokens: 96, SeqHashes: hashes(6, 1),
					Overlaps: []Overlap{{Key: wk("b", 0), Blocks: 6}}, Affinity: hardTo(workerref.Any("a"))}
				d := h.admitted(h.submit(r))
				if d.Worker != wk("a", 0) {
					t.Fatalf("selection %d went to %v, want a#0", i, d.Worker)
				}
				if err := h.s.Free(d.Fence); err != nil {
					t.Fatal(err)
				}
			}
			// Sanity: unbound, the cache on b wins.
			d := h.admitted(h.submit(&Request{ID: "free", Tokens: 96, SeqHashes: hashes(6, 1),
				Overlaps: []Overlap{{Key: wk("b", 0), Blocks: 6}}}))
			if temp == 0 && d.Worker != wk("b", 0) {
				t.Fatalf("unbound request went to %v, want b#0", d.Worker)
			}
		})
	}
}

// A classifier's target is Soft: it cannot replace a Hard binding, but it
// does replace a Soft one, and it applies when a Hard target is ineligible.
func TestHardAffinitySurvivesAClassifierTarget(t *testing.T) {
	cls := ClassifierFunc(func(*Request) (workerref.Target, bool) { return workerref.Any("b"), true })
	for _, tc := range []struct {
		name     string
		aff      *Affinity
		want     workerref.Target
		fallback bool
	}{
		{"hard binding wins", hardTo(workerref.Any("a")), wk("a", 0), false},
		{"classifier replaces soft", softTo(workerref.Any("a")), wk("b", 0), false},
		{"classifier applies when hard target is gone", hardTo(workerref.Any("gone")), wk("b", 0), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{Classifier: cls}, NewDefaultPolicy(0), wi("a", 0), wi("b", 0), wi("c", 0))
			// c is the cheapest worker by cache.
			d := h.admitted(h.submit(&Request{ID: "r", Tokens: 96, SeqHashes: hashes(6, 1), Affinity: tc.aff,
				Overlaps: []Overlap{{Key: wk("c", 0), Blocks: 6}}}))
			if d.Worker != tc.want || d.HardFallback != tc.fallback {
				t.Fatalf("got %v fallback=%v, want %v fallback=%v", d.Worker, d.HardFallback, tc.want, tc.fallback)
			}
		})
	}
}

// Hard does not narrow admission: a Hard request is admitted while any
// worker is free (and goes to its bound worker even if that one is busy),
// waits only when every worker is busy, and does not hold back a later
// unbound request.
func TestHardAffinityAdmissionStaysFleetWide(t *testing.T) {
	h := newHarness(t, Config{}, NewDefaultPolicy(0), wi("a", 0), wi("b", 0))
	h.admitted(h.submit(&Request{ID: "fill-a", Tokens: 100, Pinned: new(workerref.Any("a"))}))
	if !h.loads()[wk("a", 0)].Busy {
		t.Fatal("a should be busy")
	}
	// a is busy, b is free: the Hard request is admitted now, to a.
	d := h.admitted(h.submit(&Request{ID: "hard-1", Tokens: 100, Affinity: hardTo(workerref.Any("a"))}))
	if d.Worker != wk("a", 0) || d.HardFallback {
		t.Fatalf("hard-1 went to %v (fallback %v), want a#0", d.Worker, d.HardFallback)
	}
	// An unbound request takes b.
	fillB := h.admitted(h.submit(&Request{ID: "fill-b", Tokens: 100}))
	if fillB.Worker != wk("b", 0) {
		t.Fatalf("fill-b went to %v", fillB.Worker)
	}
	// Now every worker is busy: both wait, the Hard one first.
	hard2 := h.submit(&Request{ID: "hard-2", Tokens: 100, Affinity: hardTo(workerref.Any("a"))})
	later := h.submit(&Request{ID: "later", Tokens: 100})
	h.waiting(hard2)
	h.waiting(later)
	// Freeing b lets hard-2 in — to a, its bound worker — and the unbound
	// request behind it is not held back: it takes b.
	if err := h.s.Free(fillB.Fence); err != nil {
		t.Fatal(err)
	}
	if d := h.admitted(hard2); d.Worker != wk("a", 0) {
		t.Fatalf("hard-2 went to %v, want a#0", d.Worker)
	}
	if d := h.admitted(later); d.Worker != wk("b", 0) {
		t.Fatalf("later went to %v, want b#0", d.Worker)
	}
}

// An ineligible Hard target selects normally over the fleet.
func TestIneligibleHardTargetSelectsNormally(t *testing.T) {
	for _, tc := range []struct {
		name    string
		target  workerref.Target
		allowed []string
		setup   func(h *harness)
		seen    []workerref.Target
	}{
		{name: "unknown", target: workerref.Any("zz"),
			seen: []workerref.Target{wk("a", 0), wk("b", 0), wk("c", 0)}},
		{name: "rank out of range", target: workerref.Of("a", 5),
			seen: []workerref.Target{wk("a", 0), wk("b", 0), wk("c", 0)}},
		{name: "outside allowed set", target: workerref.Any("a"), allowed: []string{"c", "b"},
			seen: []workerref.Target{wk("b", 0), wk("c", 0)}},
		{name: "overloaded", target: workerref.Any("a"),
			setup: func(h *harness) {
				th := oneBatch()
				th.OverloadPrefillFrac = 1
				if err := h.s.SetThresholds(th); err != nil {
					h.t.Fatal(err)
				}
				h.admitted(h.submit(&Request{ID: "fill", Tokens: 100, Pinned: new(workerref.Any("a"))}))
			},
			seen: []workerref.Target{wk("b", 0), wk("c", 0)}},
		{name: "unavailable", target: workerref.Any("a"),
			setup: func(h *harness) {
				info := wi("a", 0)
				info.Available = false
				if err := h.s.UpsertWorker(info); err != nil {
					h.t.Fatal(err)
				}
			},
			seen: []workerref.Target{wk("b", 0), wk("c", 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &recordingPolicy{pick: preferWorker("c")}
			h := newHarness(t, Config{}, p, wi("a", 0), wi("b", 0), wi("c", 0))
			if tc.setup != nil {
				tc.setup(h)
				p.seen, p.affinity = nil, nil
			}
			d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Allowed: tc.allowed, Affinity: hardTo(tc.target)}))
			if d.Worker != wk("c", 0) || !d.HardFallback {
				t.Fatalf("got %v fallback=%v, want c#0 with fallback", d.Worker, d.HardFallback)
			}
			if !slices.Equal(p.seen[len(p.seen)-1], tc.seen) {
				t.Fatalf("policy saw %v, want %v", p.seen[len(p.seen)-1], tc.seen)
			}
			if h.s.Stats().HardFallbacks == 0 {
				t.Fatal("fallback not counted")
			}
		})
	}
}

// A policy filter that rejects the Hard target counts as ineligible.
func TestHardTargetRejectedByPolicyFilterFallsBack(t *testing.T) {
	p := &Pipeline{Filters: []Filter{dropWorker("a")}, Scorers: []WeightedScorer{{Scorer: DefaultCost{Params: DefaultCostParams()}, Weight: 1}}}
	h := newHarness(t, Config{}, p, wi("a", 0), wi("b", 0))
	d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Affinity: hardTo(workerref.Any("a"))}))
	if d.Worker != wk("b", 0) || !d.HardFallback {
		t.Fatalf("got %v fallback=%v", d.Worker, d.HardFallback)
	}
}

type dropWorker string

func (d dropWorker) Filter(_ *Context, c *Candidates, keep []bool) {
	for i := range c.Len() {
		keep[i] = c.Key(i).Worker != string(d)
	}
}

// Soft: the default policy keeps the bound worker while it is a candidate
// (ranked and worker-only), even when another worker is cheaper; custom
// policies get the full set plus the target.
func TestSoftKeepsTheBoundWorkerWhileItIsACandidate(t *testing.T) {
	cheapOnB := []Overlap{{Key: wk("b", 0), Blocks: 6}}
	for _, tc := range []struct {
		name   string
		target workerref.Target
		want   []workerref.Target
	}{
		{"ranked", workerref.Of("a", 1), []workerref.Target{wk("a", 1)}},
		{"worker-only", workerref.Any("a"), []workerref.Target{wk("a", 0), wk("a", 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{}, NewDefaultPolicy(0), wi("a", 0), wi("a", 1), wi("b", 0))
			d := h.admitted(h.submit(&Request{ID: "r", Tokens: 96, SeqHashes: hashes(6, 1), Overlaps: cheapOnB,
				Affinity: softTo(tc.target)}))
			if !slices.Contains(tc.want, d.Worker) || d.HardFallback {
				t.Fatalf("got %v, want one of %v", d.Worker, tc.want)
			}
			// Once the target is overloaded it is no candidate: the cost decides.
			th := oneBatch()
			th.OverloadPrefillFrac = 0.5
			if err := h.s.SetThresholds(th); err != nil {
				t.Fatal(err)
			}
			for _, k := range tc.want {
				if k != d.Worker {
					h.admitted(h.submit(&Request{ID: "fill-" + k.String(), Tokens: 100, Pinned: new(workerref.Of(k.Worker, k.Rank))}))
				}
			}
			d2 := h.admitted(h.submit(&Request{ID: "r2", Tokens: 96, SeqHashes: hashes(6, 1), Overlaps: cheapOnB,
				Affinity: softTo(tc.target)}))
			if d2.Worker != wk("b", 0) {
				t.Fatalf("with the target overloaded got %v, want b#0", d2.Worker)
			}
		})
	}
	t.Run("custom policy gets the full set", func(t *testing.T) {
		p := &recordingPolicy{pick: preferWorker("b")}
		h := newHarness(t, Config{}, p, wi("a", 0), wi("a", 1), wi("b", 0))
		d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Affinity: softTo(workerref.Of("a", 1))}))
		if d.Worker != wk("b", 0) {
			t.Fatalf("custom policy's choice overridden: %v", d.Worker)
		}
		if len(p.seen[0]) != 3 || p.affinity[0] == nil || *p.affinity[0] != workerref.Of("a", 1) {
			t.Fatalf("policy saw %v with affinity %v", p.seen[0], p.affinity[0])
		}
	})
}

// With sampling, a Soft target that is a candidate limits the choice to its
// rows (both ranks of a worker-only target get picked, nothing else does).
func TestSoftAffinityLimitsSamplingToTheBoundWorker(t *testing.T) {
	for _, temp := range []float64{0.7, 5} {
		t.Run(fmt.Sprint("T=", temp), func(t *testing.T) {
			h := newHarness(t, Config{}, NewDefaultPolicy(temp), wi("a", 0), wi("a", 1), wi("b", 0), wi("c", 0), wi("d", 0))
			got := map[workerref.Target]int{}
			unbound := map[workerref.Target]int{}
			for i := range 300 {
				for _, aff := range []*Affinity{softTo(workerref.Any("a")), nil} {
					r := &Request{ID: fmt.Sprint("r", i, aff == nil), Tokens: 32, Affinity: aff}
					d := h.admitted(h.submit(r))
					if aff != nil {
						got[d.Worker]++
					} else {
						unbound[d.Worker]++
					}
					if err := h.s.Free(d.Fence); err != nil {
						t.Fatal(err)
					}
				}
			}
			if len(got) != 2 || got[wk("a", 0)] == 0 || got[wk("a", 1)] == 0 {
				t.Fatalf("soft-bound picks: %v", got)
			}
			if len(unbound) < 4 {
				t.Fatalf("unbound picks should spread: %v", unbound)
			}
		})
	}
}

// A pinned request waiting for its busy worker blocks only that worker's
// lane.
func TestBlockedPinnedLaneDoesNotBlockOtherWorker(t *testing.T) {
	b := wi("b", 0)
	b.MaxBatchedTokens = 1000
	h := newHarness(t, Config{}, NewDefaultPolicy(0), wi("a", 0), b)
	first := h.admitted(h.submit(&Request{ID: "a-1", Tokens: 100, Pinned: new(workerref.Any("a"))}))
	blocked := h.submit(&Request{ID: "a-2", Tokens: 100, Pinned: new(workerref.Any("a"))})
	h.waiting(blocked)
	if d := h.admitted(h.submit(&Request{ID: "any", Tokens: 100})); d.Worker != wk("b", 0) {
		t.Fatalf("unbound request went to %v", d.Worker)
	}
	if d := h.admitted(h.submit(&Request{ID: "b-1", Tokens: 100, Pinned: new(workerref.Any("b"))})); d.Worker != wk("b", 0) {
		t.Fatalf("b-pinned request went to %v", d.Worker)
	}
	h.waiting(blocked)
	if err := h.s.PrefillDone(first.Fence); err != nil {
		t.Fatal(err)
	}
	if d := h.admitted(blocked); d.Worker != wk("a", 0) {
		t.Fatalf("a-2 went to %v", d.Worker)
	}
}

// A pin and an affinity requirement agree when they name the same worker
// and, where both name a rank, the same rank (workerref.Target.Agrees, the
// rule the bindings table uses too). An agreeing pair is exact on the more specific of
// the two; a disagreeing pair is rejected before selection. Every shape
// (worker-only or ranked pin × worker-only or ranked affinity), agreeing and
// disagreeing, under both strengths.
func TestPinAgreesWithAffinity(t *testing.T) {
	for _, tc := range []struct {
		name string
		pin  workerref.Target
		aff  workerref.Target
		// exact is the effective pinned target; nil = ErrPinConflict.
		exact *workerref.Target
		seen  []workerref.Target // rows the policy is offered
	}{
		{"worker pin, worker affinity, same worker", workerref.Any("a"), workerref.Any("a"),
			new(workerref.Any("a")), []workerref.Target{wk("a", 0), wk("a", 1)}},
		{"worker pin, worker affinity, other worker", workerref.Any("a"), workerref.Any("b"), nil, nil},
		{"worker pin, ranked affinity, same worker", workerref.Any("a"), workerref.Of("a", 1),
			new(workerref.Of("a", 1)), []workerref.Target{wk("a", 1)}},
		{"worker pin, ranked affinity, other worker", workerref.Any("a"), workerref.Of("b", 0), nil, nil},
		{"ranked pin, worker affinity, same worker", workerref.Of("a", 1), workerref.Any("a"),
			new(workerref.Of("a", 1)), []workerref.Target{wk("a", 1)}},
		{"ranked pin, worker affinity, other worker", workerref.Of("a", 1), workerref.Any("b"), nil, nil},
		{"ranked pin, ranked affinity, same rank", workerref.Of("a", 1), workerref.Of("a", 1),
			new(workerref.Of("a", 1)), []workerref.Target{wk("a", 1)}},
		{"ranked pin, ranked affinity, other rank", workerref.Of("a", 1), workerref.Of("a", 0), nil, nil},
		{"ranked pin, ranked affinity, other worker", workerref.Of("a", 0), workerref.Of("b", 0), nil, nil},
	} {
		for _, strength := range []session.Mode{session.Hard, session.Soft} {
			t.Run(tc.name+"/"+strength.String(), func(t *testing.T) {
				pin, aff := tc.pin, &Affinity{Target: tc.aff, Mode: strength}
				// The plan: exact on the more specific target, nothing else.
				plan, err := applyPinRule(&Request{ID: "r", Pinned: &pin, Affinity: aff}, nil)
				if tc.exact == nil {
					if !errors.Is(err, ErrPinConflict) {
						t.Fatalf("applyPinRule: %v, want ErrPinConflict", err)
					}
				} else if err != nil || plan.exact == nil || *plan.exact != *tc.exact ||
					plan.hard != nil || plan.soft != nil || plan.softOnFallback != nil {
					t.Fatalf("applyPinRule: %+v / %v, want exact %v only", plan, err, *tc.exact)
				}

				// Through the queue: the policy sees only the exact target's
				// rows, and no Soft target.
				p := &recordingPolicy{}
				h := newHarness(t, Config{}, p, wi("a", 0), wi("a", 1), wi("b", 0))
				res, ok := h.poll(h.submit(&Request{ID: "r", Tokens: 10, Pinned: &pin, Affinity: aff}))
				if !ok {
					t.Fatal("no answer")
				}
				if tc.exact == nil {
					if !errors.Is(res.err, ErrPinConflict) {
						t.Fatalf("got %v / %v, want ErrPinConflict", res.d.Worker, res.err)
					}
					if len(p.seen) != 0 {
						t.Fatal("policy consulted for a conflicting request")
					}
					if h.s.Stats().PinConflicts != 1 {
						t.Fatal("conflict not counted")
					}
					return
				}
				if res.err != nil || !tc.exact.Contains(res.d.Worker.Worker, res.d.Worker.Rank) || res.d.HardFallback {
					t.Fatalf("got %v fallback=%v / %v, want inside %v", res.d.Worker, res.d.HardFallback, res.err, *tc.exact)
				}
				if len(p.seen) != 1 || !slices.Equal(p.seen[0], tc.seen) {
					t.Fatalf("policy saw %v, want %v", p.seen, tc.seen)
				}
				if p.affinity[0] != nil {
					t.Fatalf("an agreeing affinity reached the policy as a Soft target: %v", *p.affinity[0])
				}
				if h.s.Stats().PinConflicts != 0 {
					t.Fatal("agreeing pair counted as a conflict")
				}
			})
		}
	}
}

// An agreeing pair waits in the lane of the more specific target: a
// worker-only pin bound to a busy rank does not spill onto the worker's
// free rank, and is admitted there once the rank frees up.
func TestAgreeingPinWaitsForTheMoreSpecificTarget(t *testing.T) {
	for _, tc := range []struct {
		name string
		pin  workerref.Target
		aff  *Affinity
	}{
		{"worker pin, ranked hard binding", workerref.Any("a"), hardTo(workerref.Of("a", 1))},
		{"worker pin, ranked soft binding", workerref.Any("a"), softTo(workerref.Of("a", 1))},
		{"ranked pin, worker binding", workerref.Of("a", 1), hardTo(workerref.Any("a"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{}, NewDefaultPolicy(0), wi("a", 0), wi("a", 1))
			first := h.admitted(h.submit(&Request{ID: "busy", Tokens: 100, Pinned: new(workerref.Of("a", 1))}))
			pin := tc.pin
			w := h.submit(&Request{ID: "r", Tokens: 100, Pinned: &pin, Affinity: tc.aff})
			h.waiting(w)
			if err := h.s.PrefillDone(first.Fence); err != nil {
				t.Fatal(err)
			}
			if d := h.admitted(w); d.Worker != wk("a", 1) {
				t.Fatalf("went to %v, want a#1", d.Worker)
			}
		})
	}
}

// A pin on something that can never serve is rejected at once.
func TestPinnedTargetMustBeSchedulable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pin     workerref.Target
		allowed []string
	}{
		{"unknown", workerref.Any("zz"), nil},
		{"rank out of range", workerref.Of("a", 3), nil},
		{"outside allowed", workerref.Any("a"), []string{"b"}},
		{"draining", workerref.Any("d"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := wi("d", 0)
			d.Available = false
			h := newHarness(t, Config{}, nil, wi("a", 0), wi("b", 0), d)
			pin := tc.pin
			res, _ := h.poll(h.submit(&Request{ID: "r", Tokens: 10, Pinned: &pin, Allowed: tc.allowed}))
			if !errors.Is(res.err, ErrNoEligibleWorker) {
				t.Fatalf("got %v", res.err)
			}
		})
	}
}

type panicky struct{}

func (panicky) Name() string                              { return "panicky" }
func (panicky) Select(*Context, *Candidates) (int, error) { panic("bug") }

type outOfRange struct{}

func (outOfRange) Name() string                                  { return "out-of-range" }
func (outOfRange) Select(_ *Context, c *Candidates) (int, error) { return c.Len(), nil }

// A broken custom policy fails the request, not the scheduler.
func TestBrokenPolicy(t *testing.T) {
	for _, p := range []Policy{panicky{}, outOfRange{}} {
		t.Run(p.Name(), func(t *testing.T) {
			h := newHarness(t, Config{}, p, wi("a", 0))
			res, ok := h.poll(h.submit(&Request{ID: "r", Tokens: 10}))
			if !ok || !errors.Is(res.err, ErrPolicy) {
				t.Fatalf("%v", res.err)
			}
			if st := h.s.Stats(); st.PolicyErrors != 1 || st.Bookings != 0 {
				t.Fatalf("%+v", st)
			}
		})
	}
}
