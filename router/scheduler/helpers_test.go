package scheduler

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func wk(name string, rank uint32) workerref.Target {
	return workerref.Target{Worker: name, Rank: rank}
}

// wi is an available worker with room for one 100-token prefill: a booking
// of 100 uncached tokens makes it busy under the default queue threshold.
func wi(name string, rank uint32) WorkerInfo {
	return WorkerInfo{Key: wk(name, rank), KVBlocks: 10000, MaxBatchedTokens: 100, Available: true}
}

func newFakeClock() *testutil.Clock { return testutil.NewClock(time.Unix(1_800_000_000, 0)) }

// harness drives a scheduler's core synchronously (never started), so queue
// behaviour can be checked step by step without goroutines.
type harness struct {
	t     *testing.T
	s     *Scheduler
	c     *core
	clock *testutil.Clock
}

func newHarness(t *testing.T, cfg Config, p Policy, workers ...WorkerInfo) *harness {
	t.Helper()
	clock := newFakeClock()
	if cfg.Now == nil {
		cfg.Now = clock.Now
	}
	s := newScheduler(t, cfg, 1, p, workers...)
	return &harness{t: t, s: s, c: s.c, clock: clock}
}

// newScheduler builds a scheduler (not started) with the given workers and
// the tests' defaults: seed unless cfg sets one, and the one-batch queue
// threshold unless cfg sets thresholds.
func newScheduler(t *testing.T, cfg Config, seed uint64, p Policy, workers ...WorkerInfo) *Scheduler {
	t.Helper()
	if !cfg.HasSeed {
		cfg.Seed, cfg.HasSeed = seed, true
	}
	if !cfg.ThresholdsSet {
		cfg.Thresholds, cfg.ThresholdsSet = oneBatch(), true
	}
	s, err := New(cfg, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		if err := s.UpsertWorker(w); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// submit hands r to the core; the waiter's reply holds the outcome once
// admitted or rejected.
func (h *harness) submit(r *Request) *waiter {
	h.t.Helper()
	if err := h.s.validate(r); err != nil {
		h.t.Fatalf("validate %q: %v", r.ID, err)
	}
	w := &waiter{req: r, reply: make(chan result, 1), dlIndex: -1}
	h.s.mu.Lock()
	h.c.submit(w)
	h.s.mu.Unlock()
	return w
}

func (h *harness) poll(w *waiter) (result, bool) {
	select {
	case r := <-w.reply:
		w.reply <- r // keep it readable
		return r, true
	default:
		return result{}, false
	}
}

// admitted requires w to have been admitted and returns its decision.
func (h *harness) admitted(w *waiter) Decision {
	h.t.Helper()
	r, ok := h.poll(w)
	if !ok {
		h.t.Fatalf("request %q still waiting", w.req.ID)
	}
	if r.err != nil {
		h.t.Fatalf("request %q: %v", w.req.ID, r.err)
	}
	return r.d
}

func (h *harness) waiting(w *waiter) {
	h.t.Helper()
	if r, ok := h.poll(w); ok {
		h.t.Fatalf("request %q should wait, got %+v / %v", w.req.ID, r.d, r.err)
	}
}

func (h *harness) loads() map[workerref.Target]TargetLoad {
	ls, err := h.s.Loads(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	m := map[workerref.Target]TargetLoad{}
	for _, l := range ls {
		m[l.Key] = l
	}
	return m
}

// startScheduler returns a running scheduler with the given workers.
func startScheduler(t *testing.T, cfg Config, p Policy, workers ...WorkerInfo) *Scheduler {
	t.Helper()
	s := newScheduler(t, cfg, 7, p, workers...)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// recordingPolicy records what it was offered and picks by a rule.
type recordingPolicy struct {
	pick     func(x *Context, c *Candidates) int
	seen     [][]workerref.Target
	affinity []*workerref.Target
}

func (p *recordingPolicy) Name() string { return "recording" }

func (p *recordingPolicy) Select(x *Context, c *Candidates) (int, error) {
	keys := make([]workerref.Target, c.Len())
	for i := range keys {
		keys[i] = c.Key(i)
	}
	p.seen = append(p.seen, keys)
	if t, ok := x.Affinity(); ok {
		p.affinity = append(p.affinity, &t)
	} else {
		p.affinity = append(p.affinity, nil)
	}
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	if p.pick == nil {
		return 0, nil
	}
	return p.pick(x, c), nil
}

// preferWorker picks the first candidate named w, else the first.
func preferWorker(w string) func(*Context, *Candidates) int {
	return func(_ *Context, c *Candidates) int {
		for i := range c.Len() {
			if c.Key(i).Worker == w {
				return i
			}
		}
		return 0
	}
}

func hashes(n int, salt uint64) []kvevents.SeqHash {
	out := make([]kvevents.SeqHash, n)
	for i := range out {
		out[i] = kvevents.SeqHash(salt<<32 | uint64(i+1))
	}
	return out
}

// oneBatch is the queue threshold most tests reason with: a worker is busy
// once one full batch of prefill (or its whole KV cache) is booked. The
// default (two batches) has its own test.
func oneBatch() Thresholds { return Thresholds{QueuePrefillFrac: 1, QueueDecodeFrac: 1} }
