package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// admitOrder frees worker a step by step and returns the order in which the
// waiters got in.
func admitOrder(t *testing.T, h *harness, first Decision, ws ...*waiter) string {
	t.Helper()
	var order []string
	prev := first
	for range ws {
		if err := h.s.Free(prev.Fence); err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, w := range ws {
			if r, ok := h.poll(w); ok && !slices.Contains(order, w.req.ID) {
				if r.err != nil {
					t.Fatalf("%s: %v", w.req.ID, r.err)
				}
				order = append(order, w.req.ID)
				prev = r.d
				got++
			}
		}
		if got != 1 {
			t.Fatalf("one free admitted %d requests (order so far %v)", got, order)
		}
	}
	return strings.Join(order, ",")
}

func TestQueueOrder(t *testing.T) {
	for _, tc := range []struct {
		order Order
		want  string
	}{
		{FCFS, "long,short,cached"},
		{WSPT, "cached,short,long"},
	} {
		t.Run(tc.order.String(), func(t *testing.T) {
			h := newHarness(t, Config{Queue: QueueConfig{Order: tc.order}}, nil, wi("a", 0))
			first := h.admitted(h.submit(&Request{ID: "fill", Tokens: 100}))
			long := h.submit(&Request{ID: "long", Tokens: 300})
			short := h.submit(&Request{ID: "short", Tokens: 150})
			// 300 tokens, 12 blocks (192 tokens) cached: 108 uncached, the
			// least work, and still enough to make a busy again
			cached := h.submit(&Request{ID: "cached", Tokens: 300, Overlaps: []Overlap{{Key: wk("a", 0), Blocks: 12}}})
			if got := admitOrder(t, h, first, long, short, cached); got != tc.want {
				t.Fatalf("order %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPriorityTiers(t *testing.T) {
	h := newHarness(t, Config{}, nil, wi("a", 0))
	first := h.admitted(h.submit(&Request{ID: "fill", Tokens: 100}))
	low := h.submit(&Request{ID: "low", Tokens: 100, Priority: 0})
	high := h.submit(&Request{ID: "high", Tokens: 100, Priority: 5})
	mid := h.submit(&Request{ID: "mid", Tokens: 100, Priority: 1})
	neg := h.submit(&Request{ID: "neg", Tokens: 100, Priority: -3})
	high2 := h.submit(&Request{ID: "high2", Tokens: 100, Priority: 5})
	if got := admitOrder(t, h, first, low, high, mid, neg, high2); got != "high,high2,mid,low,neg" {
		t.Fatalf("order %s", got)
	}
}

func TestQueueLimits(t *testing.T) {
	cfg := Config{Queue: QueueConfig{
		Default: QueueLimit{Requests: 2},
		Limits: map[string]QueueLimit{
			"batch":   {Tokens: 150},
			"scaled":  {Requests: 1, PerWorker: true},
			"premium": {},
		},
	}}
	h := newHarness(t, cfg, nil, wi("a", 0), wi("b", 0))
	h.admitted(h.submit(&Request{ID: "fill-a", Tokens: 100, Pinned: new(workerref.Any("a"))}))
	h.admitted(h.submit(&Request{ID: "fill-b", Tokens: 100, Pinned: new(workerref.Any("b"))}))
	over := func(r *Request) {
		t.Helper()
		res, ok := h.poll(h.submit(r))
		if !ok || !errors.Is(res.err, ErrOverloaded) {
			t.Fatalf("%s: %v", r.ID, res.err)
		}
	}
	h.waiting(h.submit(&Request{ID: "d1", Tokens: 10}))
	h.waiting(h.submit(&Request{ID: "d2", Tokens: 10}))
	over(&Request{ID: "d3", Tokens: 10})
	h.waiting(h.submit(&Request{ID: "b1", Tokens: 100, Class: "batch"}))
	over(&Request{ID: "b2", Tokens: 100, Class: "batch"})
	h.waiting(h.submit(&Request{ID: "b3", Tokens: 50, Class: "batch"}))
	h.waiting(h.submit(&Request{ID: "s1", Tokens: 10, Class: "scaled"}))
	h.waiting(h.submit(&Request{ID: "s2", Tokens: 10, Class: "scaled"}))
	over(&Request{ID: "s3", Tokens: 10, Class: "scaled"})
	for i := range 10 {
		h.waiting(h.submit(&Request{ID: fmt.Sprint("p", i), Tokens: 10, Class: "premium"}))
	}
	if st := h.s.Stats(); st.RejectedOverloaded != 3 || st.Waiting != 16 {
		t.Fatalf("%+v", st)
	}
}

func TestDeadlines(t *testing.T) {
	h := newHarness(t, Config{}, nil, wi("a", 0))
	h.admitted(h.submit(&Request{ID: "fill", Tokens: 100}))
	// Already past and would have to wait: rejected at once.
	res, _ := h.poll(h.submit(&Request{ID: "late", Tokens: 10, Deadline: h.clock.Now()}))
	if !errors.Is(res.err, ErrDeadline) {
		t.Fatalf("late: %v", res.err)
	}
	w5 := h.submit(&Request{ID: "d5", Tokens: 10, Deadline: h.clock.Now().Add(5 * time.Second)})
	w9 := h.submit(&Request{ID: "d9", Tokens: 10, Deadline: h.clock.Now().Add(9 * time.Second)})
	none := h.submit(&Request{ID: "none", Tokens: 10})
	h.clock.Advance(6 * time.Second)
	h.c.expireDeadlines(h.clock.Now())
	if res, ok := h.poll(w5); !ok || !errors.Is(res.err, ErrDeadline) {
		t.Fatalf("d5: %v", res.err)
	}
	h.waiting(w9)
	h.clock.Advance(3 * time.Second)
	h.c.expireDeadlines(h.clock.Now())
	if res, ok := h.poll(w9); !ok || !errors.Is(res.err, ErrDeadline) {
		t.Fatalf("d9: %v", res.err)
	}
	h.waiting(none)
	if h.s.Stats().RejectedDeadline != 3 || h.c.q.dl.Len() != 0 {
		t.Fatalf("%+v", h.s.Stats())
	}
}

// NoWait: refused at once with ErrWouldQueue where the request would
// wait, booking and queueing nothing; admitted as usual where a worker
// has room.
func TestNoWait(t *testing.T) {
	h := newHarness(t, Config{}, nil, wi("a", 0))
	h.admitted(h.submit(&Request{ID: "room", Tokens: 10, NoWait: true}))
	fill := h.admitted(h.submit(&Request{ID: "fill", Tokens: 100}))
	res, ok := h.poll(h.submit(&Request{ID: "busy", Tokens: 10, NoWait: true}))
	if !ok || !errors.Is(res.err, ErrWouldQueue) {
		t.Fatalf("busy: %v (answered %v), want ErrWouldQueue", res.err, ok)
	}
	if n := len(h.c.q.byID); n != 0 {
		t.Fatalf("%d queued after a NoWait refusal", n)
	}
	if _, booked := h.c.bookings["busy"]; booked {
		t.Fatal("a NoWait refusal booked")
	}
	if st := h.s.Stats(); st.RejectedDeadline != 0 {
		t.Fatalf("a NoWait refusal counted as a deadline: %+v", st)
	}
	// Without NoWait the same request waits, and gets in once room is made.
	w := h.submit(&Request{ID: "busy", Tokens: 10})
	h.waiting(w)
	if err := h.s.Free(fill.Fence); err != nil {
		t.Fatal(err)
	}
	if res, ok := h.poll(w); !ok || res.err != nil {
		t.Fatalf("busy after a free: %v (answered %v)", res.err, ok)
	}
}

// A waiter older than RefreshAfter gets fresh overlaps before selection.
func TestRefreshOverlapsForLongWaiters(t *testing.T) {
	var refreshed []string
	cfg := Config{Refresh: func(r *Request, dst []Overlap) []Overlap {
		refreshed = append(refreshed, r.ID)
		return append(dst, Overlap{Key: wk("b", 0), Blocks: 6})
	}}
	h := newHarness(t, cfg, NewDefaultPolicy(0), wi("a", 0), wi("b", 0))
	fa := h.admitted(h.submit(&Request{ID: "fill-a", Tokens: 100, Pinned: new(workerref.Any("a"))}))
	fb := h.admitted(h.submit(&Request{ID: "fill-b", Tokens: 100, Pinned: new(workerref.Any("b"))}))
	stale := []Overlap{{Key: wk("a", 0), Blocks: 6}}
	old := h.submit(&Request{ID: "old", Tokens: 96, SeqHashes: hashes(6, 1), Overlaps: stale})
	h.clock.Advance(5 * time.Second)
	young := h.submit(&Request{ID: "young", Tokens: 96, SeqHashes: hashes(6, 2), Overlaps: stale})
	h.clock.Advance(6 * time.Second) // old waited 11 s, young 6 s
	if err := h.s.PrefillDone(fb.Fence); err != nil {
		t.Fatal(err)
	}
	if d := h.admitted(old); d.Worker != wk("b", 0) || d.OverlapBlocks != 6 || d.Waited != 11*time.Second {
		t.Fatalf("old: %+v", d)
	}
	if err := h.s.PrefillDone(fa.Fence); err != nil {
		t.Fatal(err)
	}
	if d := h.admitted(young); d.Worker != wk("a", 0) || d.OverlapBlocks != 6 {
		t.Fatalf("young: %+v", d)
	}
	if !slices.Equal(refreshed, []string{"old"}) || h.s.Stats().Refreshes != 1 {
		t.Fatalf("refreshed %v", refreshed)
	}
}

func TestCancel(t *testing.T) {
	h := newHarness(t, Config{}, nil, wi("a", 0))
	d := h.admitted(h.submit(&Request{ID: "booked", Tokens: 100}))
	q := h.submit(&Request{ID: "queued", Tokens: 100})
	h.waiting(q)
	if err := h.s.Cancel("queued"); err != nil {
		t.Fatal(err)
	}
	if res, ok := h.poll(q); !ok || !errors.Is(res.err, ErrCanceled) {
		t.Fatalf("%v", res.err)
	}
	if err := h.s.Cancel("booked"); err != nil {
		t.Fatal(err)
	}
	if err := h.s.Free(d.Fence); !errors.Is(err, ErrUnknownBooking) {
		t.Fatal(err)
	}
	if err := h.s.Cancel("nope"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatal(err)
	}
	// A queued request id is taken too.
	h.admitted(h.submit(&Request{ID: "fill", Tokens: 100}))
	h.waiting(h.submit(&Request{ID: "dup", Tokens: 1}))
	if res, _ := h.poll(h.submit(&Request{ID: "dup", Tokens: 1})); !errors.Is(res.err, ErrDuplicateRequest) {
		t.Fatal(res.err)
	}
}

// Raising the queue threshold at run time drains waiters; so does a new
// worker; an allowed set restricts both admission and selection.
func TestQueueDrainsOnCapacityChanges(t *testing.T) {
	h := newHarness(t, Config{}, nil, wi("a", 0))
	h.admitted(h.submit(&Request{ID: "fill", Tokens: 100}))
	w1 := h.submit(&Request{ID: "w1", Tokens: 100})
	h.waiting(w1)
	th := oneBatch()
	th.QueuePrefillFrac = 2
	if err := h.s.SetThresholds(th); err != nil {
		t.Fatal(err)
	}
	if h.s.Thresholds() != th {
		t.Fatal("thresholds not stored")
	}
	h.admitted(w1)
	onlyB := h.submit(&Request{ID: "only-b", Tokens: 10, Allowed: []string{"b"}})
	if res, ok := h.poll(onlyB); !ok || !errors.Is(res.err, ErrNoEligibleWorker) {
		t.Fatalf("no b yet: %v", res.err)
	}
	w2 := h.submit(&Request{ID: "w2", Tokens: 10})
	h.waiting(w2)
	onlyB = h.submit(&Request{ID: "only-b2", Tokens: 10, Allowed: []string{"b"}})
	b := wi("b", 0)
	b.Available = false
	if err := h.s.UpsertWorker(b); err != nil { // registered but draining: still nothing for only-b2
		t.Fatal(err)
	}
	if res, ok := h.poll(onlyB); !ok || !errors.Is(res.err, ErrNoEligibleWorker) {
		t.Fatalf("b draining: %v", res.err)
	}
	h.waiting(w2)
	b.Available = true
	if err := h.s.UpsertWorker(b); err != nil {
		t.Fatal(err)
	}
	if d := h.admitted(w2); d.Worker != wk("b", 0) {
		t.Fatalf("w2: %v", d.Worker)
	}
	if err := h.s.SetThresholds(Thresholds{QueuePrefillFrac: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatal(err)
	}
}

func TestValidation(t *testing.T) {
	s, err := New(Config{Model: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Request{
		nil,
		{},
		{ID: "x", Tokens: -1},
		{ID: "x", Tokens: 16, SeqHashes: hashes(2, 1)},
		{ID: "x", Model: "other"},
		{ID: "x", Pinned: &workerref.Target{}},
		{ID: "x", Affinity: &Affinity{Target: workerref.Any("a")}},
		{ID: "x", Affinity: &Affinity{Mode: session.Hard}},
		{ID: "x", Overlaps: []Overlap{{Key: wk("a", 0), Blocks: -1}}},
		{ID: "x", Overlaps: []Overlap{{Key: wk("a", 0), Blocks: 2, Reported: -1}}},
		{ID: "x", Overlaps: []Overlap{{Key: wk("a", 0), Blocks: 2, Reported: 3}}},
	} {
		if _, err := s.Schedule(context.Background(), r); !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("%+v: %v", r, err)
		}
	}
	if _, err := s.Schedule(context.Background(), &Request{ID: "ok"}); !errors.Is(err, ErrNotStarted) {
		t.Fatal(err)
	}
	_ = s.Close()
	if _, err := s.Schedule(context.Background(), &Request{ID: "ok"}); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := s.Free(Fence{}); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}

// Through the actor: concurrent callers, waits, context cancellation,
// deadlines on the real timer and Close.
func TestActor(t *testing.T) {
	t.Run("concurrent", func(t *testing.T) {
		s := startScheduler(t, Config{}, NewDefaultPolicy(0.5), wi("a", 0), wi("b", 0), wi("c", 0))
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for g := range 8 {
			wg.Go(func() {
				for i := range 50 {
					d, err := s.Schedule(context.Background(), &Request{ID: fmt.Sprint(g, "-", i), Tokens: 60, SeqHashes: hashes(3, uint64(i%3))})
					if err != nil {
						errs <- err
						return
					}
					if i%2 == 0 {
						_ = s.PrefillDone(d.Fence)
					}
					if err := s.Free(d.Fence); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		ls, err := s.Loads(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.ActiveRequests != 0 || l.PrefillTokens != 0 || l.DecodeBlocks != 0 {
				t.Fatalf("leftover load %+v", l)
			}
		}
		if st := s.Stats(); st.Admitted != 400 || st.Bookings != 0 {
			t.Fatalf("%+v", st)
		}
	})
	t.Run("cancel while queued and after admission", func(t *testing.T) {
		s := startScheduler(t, Config{}, nil, wi("a", 0))
		d, err := s.Schedule(context.Background(), &Request{ID: "fill", Tokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if _, err := s.Schedule(ctx, &Request{ID: "q", Tokens: 100}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if st := s.Stats(); st.Waiting != 0 || st.Canceled != 1 {
			t.Fatalf("%+v", st)
		}
		// The id is free again.
		if err := s.Free(d.Fence); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Schedule(context.Background(), &Request{ID: "q", Tokens: 10}); err != nil {
			t.Fatal(err)
		}
		// Abandonment after admission rolls the booking back.
		w := &waiter{req: &Request{ID: "late", Tokens: 10}, reply: make(chan result, 1), dlIndex: -1}
		var fence Fence
		if err := s.do(func(c *core) { c.submit(w); fence = w.fence }); err != nil {
			t.Fatal(err)
		}
		if err := s.call(command{op: opAbandon, w: w}); err != nil {
			t.Fatal(err)
		}
		if err := s.Free(fence); !errors.Is(err, ErrUnknownBooking) {
			t.Fatalf("abandoned booking not rolled back: %v", err)
		}
	})
	t.Run("deadline timer", func(t *testing.T) {
		s := startScheduler(t, Config{}, nil, wi("a", 0))
		if _, err := s.Schedule(context.Background(), &Request{ID: "fill", Tokens: 100}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := s.Schedule(context.Background(), &Request{ID: "d", Tokens: 10, Deadline: time.Now().Add(30 * time.Millisecond)})
		if !errors.Is(err, ErrDeadline) || time.Since(start) > 2*time.Second {
			t.Fatalf("%v after %v", err, time.Since(start))
		}
	})
	t.Run("close fails waiters", func(t *testing.T) {
		s := startScheduler(t, Config{}, nil, wi("a", 0))
		if _, err := s.Schedule(context.Background(), &Request{ID: "fill", Tokens: 100}); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := s.Schedule(context.Background(), &Request{ID: "w", Tokens: 10})
			errc <- err
		}()
		testutil.Eventually(t, 5*time.Second, func() bool { return s.Stats().Waiting == 1 },
			func() string { return fmt.Sprintf("request w not queued: %+v", s.Stats()) })
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Fatal(err)
		}
		if err := s.UpsertWorker(wi("b", 0)); !errors.Is(err, ErrClosed) {
			t.Fatal(err)
		}
		if _, err := s.Loads(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatal(err)
		}
	})
	t.Run("context stops the actor", func(t *testing.T) {
		s, err := New(Config{Thresholds: oneBatch(), ThresholdsSet: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Start(ctx); err == nil {
			t.Fatal("second start accepted")
		}
		cancel()
		if _, err := s.Schedule(context.Background(), &Request{ID: "x"}); !errors.Is(err, ErrClosed) && !errors.Is(err, ErrNoEligibleWorker) {
			t.Fatal(err)
		}
		_ = s.Close()
	})
	t.Run("booking events in order", func(t *testing.T) {
		var mu sync.Mutex
		var kinds []string
		s := startScheduler(t, Config{}, nil, wi("a", 0))
		s.OnBookingChange(func(ev BookingEvent) {
			mu.Lock()
			kinds = append(kinds, fmt.Sprint(ev.Kind, ":", ev.RequestID, ":", ev.Seq > 0, ":", ev.Replica == s.Replica()))
			mu.Unlock()
		})
		d, _ := s.Schedule(context.Background(), &Request{ID: "x", Tokens: 10})
		_ = s.PrefillDone(d.Fence)
		_ = s.Free(d.Fence)
		mu.Lock()
		defer mu.Unlock()
		if strings.Join(kinds, " ") != "add:x:true:true prefill_done:x:true:true free:x:true:true" {
			t.Fatal(kinds)
		}
	})
}

// Property test: random arrivals, prefill completions and frees against a
// naive reference model. Every worker takes two 100-token prefills before it
// is busy (and, with overload = queue threshold, ineligible). Invariants
// after every step:
//   - never oversubscribes: no worker's booked prefill exceeds its budget;
//   - work conserving: a waiting pinned request's worker is busy, and a
//     waiting unpinned request finds every worker busy (so a blocked pinned
//     lane never holds anything else back);
//   - FCFS within a tier and strict priority across tiers for unpinned
//     requests, FCFS within a tier per pinned lane;
//   - the scheduler's load view equals the model's.
func TestQueueProperty(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 8
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { queueProperty(t, uint64(seed)) })
	}
}

func queueProperty(t *testing.T, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 99))
	workers := []string{"a", "b", "c"}
	const budget = 200
	cfg := Config{Thresholds: Thresholds{OverloadPrefillFrac: 1, QueuePrefillFrac: 1}, ThresholdsSet: true}
	var infos []WorkerInfo
	for _, w := range workers {
		infos = append(infos, WorkerInfo{Key: wk(w, 0), MaxBatchedTokens: budget, KVBlocks: 1 << 20, Available: true})
	}
	policies := []Policy{NewDefaultPolicy(0), NewDefaultPolicy(0.7), RoundRobin{}, PowerOfTwo{}, NewTwoTier()}
	h := newHarness(t, cfg, policies[seed%uint64(len(policies))], infos...)

	type req struct {
		w       *waiter
		seq     int
		tier    int
		pin     string
		worker  string
		fence   Fence
		prefill bool // prefill still booked
	}
	var admittedLog []*req
	byWaiter := map[*waiter]*req{}
	h.c.onAdmit = func(w *waiter, slot int32) {
		r := byWaiter[w]
		r.worker = h.c.fl.key[slot].Worker
		admittedLog = append(admittedLog, r)
	}
	var waiting, active []*req
	load := map[string]int{}
	seq := 0
	for step := range 400 {
		admittedLog = admittedLog[:0]
		switch op := rnd.IntN(10); {
		case op < 6: // arrival
			seq++
			r := &req{seq: seq, tier: rnd.IntN(3)}
			if rnd.IntN(10) < 3 {
				r.pin = workers[rnd.IntN(len(workers))]
			}
			rq := &Request{ID: fmt.Sprint("r", seq), Tokens: 100, Priority: r.tier}
			if r.pin != "" {
				rq.Pinned = new(workerref.Any(r.pin))
			}
			w := &waiter{req: rq, reply: make(chan result, 1), dlIndex: -1}
			r.w = w
			byWaiter[w] = r
			waiting = append(waiting, r)
			h.c.submit(w)
		case op < 8 && len(active) > 0: // prefill done
			r := active[rnd.IntN(len(active))]
			if err := h.s.PrefillDone(r.fence); err != nil {
				t.Fatal(err)
			}
			if r.prefill {
				r.prefill = false
				load[r.worker] -= 100
			}
		case len(active) > 0: // free
			i := rnd.IntN(len(active))
			r := active[i]
			if err := h.s.Free(r.fence); err != nil {
				t.Fatal(err)
			}
			if r.prefill {
				load[r.worker] -= 100
			}
			active = slices.Delete(active, i, i+1)
		}
		// Collect this step's admissions, in the order they happened.
		for _, r := range admittedLog {
			res, ok := h.poll(r.w)
			if !ok || res.err != nil {
				t.Fatalf("step %d: %s admitted without a good reply: %v", step, r.w.req.ID, res.err)
			}
			if r.pin != "" && res.d.Worker.Worker != r.pin {
				t.Fatalf("step %d: pinned %s went to %v", step, r.pin, res.d.Worker)
			}
			if load[r.worker] >= budget {
				t.Fatalf("step %d: %s admitted to busy worker %s (load %d)", step, r.w.req.ID, r.worker, load[r.worker])
			}
			r.fence, r.prefill = res.d.Fence, true
			load[r.worker] += 100
			active = append(active, r)
			waiting = slices.DeleteFunc(waiting, func(x *req) bool { return x == r })
		}
		// Order: within this step, unpinned admissions go by (tier desc,
		// arrival asc); pinned ones likewise per lane.
		lastUnpinned := (*req)(nil)
		lastPinned := map[string]*req{}
		for _, r := range admittedLog {
			prev := lastUnpinned
			if r.pin != "" {
				prev = lastPinned[r.pin]
			}
			if prev != nil && (prev.tier < r.tier || (prev.tier == r.tier && prev.seq > r.seq)) {
				t.Fatalf("step %d: %s (tier %d) admitted after %s (tier %d)", step, r.w.req.ID, r.tier, prev.w.req.ID, prev.tier)
			}
			if r.pin != "" {
				lastPinned[r.pin] = r
			} else {
				lastUnpinned = r
			}
		}
		allBusy := true
		for _, w := range workers {
			if load[w] > budget {
				t.Fatalf("step %d: %s oversubscribed: %d", step, w, load[w])
			}
			if load[w] < budget {
				allBusy = false
			}
		}
		for _, r := range waiting {
			if _, ok := h.poll(r.w); ok {
				t.Fatalf("step %d: %s answered without being admitted", step, r.w.req.ID)
			}
			if r.pin != "" && load[r.pin] < budget {
				t.Fatalf("step %d: pinned %s waits but %s has room (%d)", step, r.w.req.ID, r.pin, load[r.pin])
			}
			if r.pin == "" && !allBusy {
				t.Fatalf("step %d: %s waits but a worker has room: %v", step, r.w.req.ID, load)
			}
			// Nothing that waits was overtaken by a lower-or-equal ranked
			// admission of its own queue in this step.
			for _, a := range admittedLog {
				if a.pin == r.pin && (a.tier < r.tier || (a.tier == r.tier && a.seq > r.seq)) {
					t.Fatalf("step %d: %s admitted while %s waits", step, a.w.req.ID, r.w.req.ID)
				}
			}
		}
		ls := h.loads()
		for _, w := range workers {
			if ls[wk(w, 0)].PrefillTokens != load[w] {
				t.Fatalf("step %d: %s load %d, model %d", step, w, ls[wk(w, 0)].PrefillTokens, load[w])
			}
		}
	}
	if len(active) == 0 && len(waiting) == 0 {
		t.Fatal("degenerate run")
	}
}

// The default queue threshold is eight full batches of prefill: a worker
// with a few long prompts booked is not busy (at two, one long prompt in
// prefill and one queued made it busy, and the engines starved behind the
// router's queue at saturation), the eighth full batch makes it busy.
func TestDefaultQueueThresholdIsEightBatches(t *testing.T) {
	if th := DefaultThresholds(); th != (Thresholds{QueuePrefillFrac: 8, QueueDecodeFrac: 1}) {
		t.Fatalf("default thresholds %+v", th)
	}
	h := newHarness(t, Config{Thresholds: DefaultThresholds(), ThresholdsSet: true}, nil, wi("a", 0))
	for i := range 8 { // up to seven batches booked before each: not busy
		h.admitted(h.submit(&Request{ID: fmt.Sprintf("r%d", i), Tokens: 100}))
	}
	h.waiting(h.submit(&Request{ID: "ninth", Tokens: 1})) // eight batches booked: busy
}

// heldSpy picks the first candidate and records each selection's
// Context.HeldShare.
type heldSpy struct{ seen []float64 }

func (p *heldSpy) Name() string { return "held-spy" }
func (p *heldSpy) Select(x *Context, _ *Candidates) (int, error) {
	p.seen = append(p.seen, x.HeldShare)
	return 0, nil
}

// A selection whose request waited in the queue raises the held share the
// next selections see by 1/256 (an average over about 256 selections);
// selections admitted at once let it decay.
func TestHeldShare(t *testing.T) {
	spy := &heldSpy{}
	h := newHarness(t, Config{}, spy, wi("a", 0))
	first := h.admitted(h.submit(&Request{ID: "fill", Tokens: 100}))
	second := h.submit(&Request{ID: "held", Tokens: 100})
	h.waiting(second)
	if err := h.s.Free(first.Fence); err != nil {
		t.Fatal(err)
	}
	if err := h.s.Free(h.admitted(second).Fence); err != nil {
		t.Fatal(err)
	}
	third := h.admitted(h.submit(&Request{ID: "after", Tokens: 100}))
	if err := h.s.Free(third.Fence); err != nil {
		t.Fatal(err)
	}
	h.admitted(h.submit(&Request{ID: "later", Tokens: 100}))
	const step = 1.0 / cachedShareSpan
	want := []float64{0, 0, step, step * (1 - step)}
	if len(spy.seen) != len(want) {
		t.Fatalf("%d selections, want %d", len(spy.seen), len(want))
	}
	for i := range want {
		if math.Abs(spy.seen[i]-want[i]) > 1e-12 {
			t.Fatalf("held shares seen %v, want %v", spy.seen, want)
		}
	}
}
