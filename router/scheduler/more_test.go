package scheduler

import (
	"fmt"
	"testing"

	"github.com/kvrouter/kvrouter/workerref"
)

// A request whose allowed set is all busy waits without holding back later
// requests that can use other workers.
func TestRestrictedWaiterDoesNotBlockOthers(t *testing.T) {
	h := newHarness(t, Config{}, nil, wi("a", 0), wi("b", 0))
	h.admitted(h.submit(&Request{ID: "fill-a", Tokens: 100, Pinned: new(workerref.Any("a"))}))
	onlyA := h.submit(&Request{ID: "only-a", Tokens: 100, Allowed: []string{"a"}})
	h.waiting(onlyA)
	if d := h.admitted(h.submit(&Request{ID: "any", Tokens: 50})); d.Worker != wk("b", 0) {
		t.Fatalf("any went to %v", d.Worker)
	}
	h.waiting(onlyA)
}

// A worker-only Hard target narrows to its eligible ranks: an overloaded
// rank drops out, the other still binds.
func TestHardWorkerTargetSkipsOverloadedRank(t *testing.T) {
	th := oneBatch()
	th.OverloadPrefillFrac = 1
	h := newHarness(t, Config{Thresholds: th, ThresholdsSet: true}, NewDefaultPolicy(0), wi("a", 0), wi("a", 1), wi("b", 0))
	h.admitted(h.submit(&Request{ID: "fill", Tokens: 100, Pinned: new(workerref.Of("a", 0))}))
	d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10, Affinity: hardTo(workerref.Any("a")),
		Overlaps: []Overlap{{Key: wk("b", 0), Blocks: 1}}}))
	if d.Worker != wk("a", 1) || d.HardFallback {
		t.Fatalf("got %v fallback=%v", d.Worker, d.HardFallback)
	}
}

// With a seed, two schedulers that learned the same workers in different
// orders make the same picks for the same requests.
func TestSeededPicksAreReproducible(t *testing.T) {
	var ws []WorkerInfo
	for i := range 8 {
		ws = append(ws, WorkerInfo{Key: wk(fmt.Sprint("w", i), uint32(i%2)), Available: true})
	}
	rev := make([]WorkerInfo, len(ws))
	for i, w := range ws {
		rev[len(ws)-1-i] = w
	}
	for _, temp := range []float64{0, 0.7} {
		h1 := newHarness(t, Config{Seed: 42, HasSeed: true}, NewDefaultPolicy(temp), ws...)
		h2 := newHarness(t, Config{Seed: 42, HasSeed: true}, NewDefaultPolicy(temp), rev...)
		for i := range 50 {
			mk := func() *Request { return &Request{ID: fmt.Sprint("r", i), Tokens: 32 * (i%5 + 1)} }
			d1, d2 := h1.admitted(h1.submit(mk())), h2.admitted(h2.submit(mk()))
			if d1.Worker != d2.Worker {
				t.Fatalf("T=%v request %d: %v vs %v", temp, i, d1.Worker, d2.Worker)
			}
			if i%3 == 0 {
				_ = h1.s.Free(d1.Fence)
				_ = h2.s.Free(d2.Fence)
			}
		}
	}
}

// The policy seed is used when the scheduler has none.
func TestPolicySeed(t *testing.T) {
	p := NewDefaultPolicy(1)
	p.SeedValue, p.HasSeed = 9, true
	s1, _ := New(Config{}, p)
	s2, _ := New(Config{}, p)
	if s1.c.rng != s2.c.rng {
		t.Fatal("policy seed ignored")
	}
}

// FuzzApplyRemote: arbitrary remote event sequences never panic, never make
// a load negative, and leave nothing behind once every worker is removed.
func FuzzApplyRemote(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte("add add free prefill done"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newHarness(t, Config{MaxRemoteBookings: 4}, nil, wi("a", 0), wi("b", 1))
		for len(data) >= 6 {
			b := data[:6]
			data = data[6:]
			ev := BookingEvent{
				Replica:       []string{"r1", "r2", h.s.Replica()}[b[0]%3],
				Kind:          BookingKind(b[1] % 5),
				RequestID:     fmt.Sprint("q", b[2]%6),
				Worker:        []string{"a", "b", "c", ""}[b[3]%4],
				Rank:          uint32(b[3] / 4 % 2),
				Attempt:       uint64(b[4] % 3),
				PrefillTokens: int(int8(b[5])) * 10,
				Blocks:        int(int8(b[5])),
			}
			_ = h.s.ApplyRemote(ev)
			if b[0]%7 == 0 {
				_ = h.s.ObserveLoad(LoadReport{Key: wk("a", 0), ActiveRequests: int(b[5] % 4), PrefillTokens: int(b[2])})
			}
			for _, l := range h.loads() {
				if l.PrefillTokens < 0 || l.DecodeBlocks < 0 || l.ActiveRequests < 0 {
					t.Fatalf("negative load after %+v: %+v", ev, l)
				}
			}
		}
		_ = h.s.RemoveWorker("a")
		_ = h.s.RemoveWorker("b")
		if len(h.c.remote) != 0 {
			t.Fatalf("%d remote bookings left", len(h.c.remote))
		}
	})
}

// FuzzPolicyYAML: any document either builds a policy that can select or
// fails with an error; it never panics.
func FuzzPolicyYAML(f *testing.F) {
	for _, s := range []string{"name: default", "name: pipeline\nparams: {scorers: [{name: overlap}]}",
		"name: two-tier\nparams: {cache_threshold: 2}", "name: softmax", "{"} {
		f.Add([]byte(s))
	}
	reg := NewRegistry()
	f.Fuzz(func(t *testing.T, doc []byte) {
		p, err := reg.BuildYAML(doc)
		if err != nil {
			return
		}
		x, c := NewCandidates(&Request{Tokens: 64}, 16, 4, 1, nil, []CandidateRow{{Key: wk("a", 0)}, {Key: wk("b", 0), OverlapBlocks: 2}})
		if i, err := p.Select(x, c); err == nil && (i < 0 || i >= c.Len()) {
			t.Fatalf("%q chose %d", doc, i)
		}
	})
}

// A request with many shared-prefix bookings across workers: the potential
// decode blocks seen by the policy count each worker's active prefix once.
func TestSharedBlocksPerWorker(t *testing.T) {
	var got map[workerref.Target]int
	p := &recordingPolicy{pick: func(_ *Context, c *Candidates) int {
		got = map[workerref.Target]int{}
		for i := range c.Len() {
			got[c.Key(i)] = c.PotentialDecodeBlocks(i)
		}
		return 0
	}}
	h := newHarness(t, Config{}, p, bigWorker("a"), bigWorker("b"))
	base := hashes(8, 3)
	// a holds the first 6 blocks of the chain, b the first 2 (twice).
	h.admitted(h.submit(&Request{ID: "a6", Tokens: 96, SeqHashes: base[:6], Pinned: new(workerref.Any("a"))}))
	h.admitted(h.submit(&Request{ID: "b2", Tokens: 32, SeqHashes: base[:2], Pinned: new(workerref.Any("b"))}))
	h.admitted(h.submit(&Request{ID: "b2'", Tokens: 32, SeqHashes: base[:2], Pinned: new(workerref.Any("b"))}))
	h.admitted(h.submit(&Request{ID: "r", Tokens: 128, SeqHashes: base}))
	// a: 6 booked + 8 new − 6 shared = 8; b: 2 booked + 8 − 2 = 8
	if got[wk("a", 0)] != 8 || got[wk("b", 0)] != 8 {
		t.Fatalf("potential decode blocks %v", got)
	}
}
