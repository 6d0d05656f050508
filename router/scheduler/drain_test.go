package scheduler

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// draining is wi for a worker that drains: not available, still serving
// the Hard sessions bound to it.
func draining(name string, rank uint32) WorkerInfo {
	w := wi(name, rank)
	w.Available, w.Draining = false, true
	return w
}

// A draining worker keeps serving the Hard sessions bound to it (no
// fallback, so the host's commit keeps the binding instead of rejecting),
// for every policy, ranked or not; it takes no Soft and no unbound work.
func TestDrainingWorkerServesOnlyItsHardSessions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		aff      *Affinity
		want     workerref.Target
		fallback bool
	}{
		{"hard worker-only", hardTo(workerref.Any("a")), wk("a", 0), false},
		{"hard ranked", hardTo(workerref.Of("a", 1)), wk("a", 1), false},
		{"soft moves", softTo(workerref.Any("a")), wk("b", 0), false},
		{"unbound", nil, wk("b", 0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The custom policy prefers a wherever it is a candidate.
			p := &recordingPolicy{pick: preferWorker("a")}
			h := newHarness(t, Config{}, p, draining("a", 0), draining("a", 1), wi("b", 0))
			d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Affinity: tc.aff}))
			if d.Worker != tc.want || d.HardFallback != tc.fallback {
				t.Fatalf("got %v fallback=%v, want %v fallback=%v", d.Worker, d.HardFallback, tc.want, tc.fallback)
			}
			if tc.aff == nil || tc.aff.Mode != session.Hard {
				for _, seen := range p.seen {
					if slices.ContainsFunc(seen, func(k workerref.Target) bool { return k.Worker == "a" }) {
						t.Fatalf("the draining worker was a candidate for non-Hard work: %v", seen)
					}
				}
			}
		})
	}
}

// The default policy never puts a new session on a draining worker, even
// where its cache would win, and keeps the bound Hard sessions there.
func TestDrainingWorkerDefaultPolicy(t *testing.T) {
	h := newHarness(t, Config{}, NewDefaultPolicy(0), draining("a", 0), wi("b", 0))
	cached := []Overlap{{Key: wk("a", 0), Blocks: 6}}
	for i := range 20 {
		for _, aff := range []*Affinity{nil, softTo(workerref.Any("a")), hardTo(workerref.Any("a"))} {
			r := &Request{ID: fmt.Sprint("r", i, aff), Tokens: 96, SeqHashes: hashes(6, 1), Overlaps: cached, Affinity: aff}
			d := h.admitted(h.submit(r))
			want := wk("b", 0)
			if aff != nil && aff.Mode == session.Hard {
				want = wk("a", 0)
			}
			if d.Worker != want || d.HardFallback {
				t.Fatalf("request %d affinity %v: got %v fallback=%v, want %v", i, aff, d.Worker, d.HardFallback, want)
			}
			if err := h.s.Free(d.Fence); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A draining worker is still subject to the overload threshold, and one
// that stops draining without becoming available (unavailable, or suspect
// in the registry) serves nothing: the Hard request falls back, and the
// host's commit decides (reject while the worker is live).
func TestDrainingWorkerIneligibleWhenOverloadedOrUnavailable(t *testing.T) {
	t.Run("overloaded", func(t *testing.T) {
		h := newHarness(t, Config{}, nil, draining("a", 0), wi("b", 0))
		th := oneBatch()
		th.OverloadPrefillFrac = 1
		if err := h.s.SetThresholds(th); err != nil {
			t.Fatal(err)
		}
		first := h.admitted(h.submit(&Request{ID: "fill", Tokens: 100, Affinity: hardTo(workerref.Any("a"))}))
		if first.Worker != wk("a", 0) || first.HardFallback {
			t.Fatalf("first Hard request: %v fallback=%v", first.Worker, first.HardFallback)
		}
		d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Affinity: hardTo(workerref.Any("a"))}))
		if d.Worker != wk("b", 0) || !d.HardFallback {
			t.Fatalf("Hard request to an overloaded draining worker: %v fallback=%v", d.Worker, d.HardFallback)
		}
	})
	t.Run("unavailable", func(t *testing.T) {
		h := newHarness(t, Config{}, nil, draining("a", 0), wi("b", 0))
		u := wi("a", 0)
		u.Available = false
		if err := h.s.UpsertWorker(u); err != nil {
			t.Fatal(err)
		}
		d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Affinity: hardTo(workerref.Any("a"))}))
		if d.Worker != wk("b", 0) || !d.HardFallback {
			t.Fatalf("Hard request to an unavailable worker: %v fallback=%v", d.Worker, d.HardFallback)
		}
	})
	t.Run("ready again", func(t *testing.T) {
		h := newHarness(t, Config{}, NewDefaultPolicy(0), draining("a", 0), wi("b", 0))
		if err := h.s.UpsertWorker(wi("a", 0)); err != nil {
			t.Fatal(err)
		}
		cached := []Overlap{{Key: wk("a", 0), Blocks: 6}}
		d := h.admitted(h.submit(&Request{ID: "r", Tokens: 96, SeqHashes: hashes(6, 1), Overlaps: cached}))
		if d.Worker != wk("a", 0) {
			t.Fatalf("back from draining, the cached worker got nothing: %v", d.Worker)
		}
	})
}

// A Hard session whose worker drains is served there even when no other
// worker is available (a one-worker fleet, or every other worker
// unavailable): the drain must not turn its requests into
// no_eligible_worker, while unbound work still gets it.
func TestDrainingOnlyWorkerServesItsHardSessions(t *testing.T) {
	p := &recordingPolicy{pick: preferWorker("a")}
	b := wi("b", 0)
	b.Available = false
	h := newHarness(t, Config{}, p, draining("a", 0), b)
	d := h.admitted(h.submit(&Request{ID: "hard", Tokens: 10, Affinity: hardTo(workerref.Any("a"))}))
	if d.Worker != wk("a", 0) || d.HardFallback {
		t.Fatalf("Hard session of the draining worker: got %v fallback=%v, want a#0 on its binding", d.Worker, d.HardFallback)
	}
	res, done := h.poll(h.submit(&Request{ID: "unbound", Tokens: 10}))
	if !done || res.err == nil {
		t.Fatalf("unbound work with only a draining worker: %+v done=%v, want no eligible worker", res, done)
	}
}
