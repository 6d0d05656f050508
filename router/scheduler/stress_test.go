package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// TestStress drives every entry point concurrently:
// scheduling with random deadlines and cancellations, lifecycle calls,
// membership churn, remote events, load reports and threshold changes. It
// checks that nothing deadlocks, every call returns a documented error, and
// that once the dust settles no load is left behind.
func TestStress(t *testing.T) {
	rounds := 300
	if testing.Short() {
		rounds = 60
	}
	s := startScheduler(t, Config{Queue: QueueConfig{Default: QueueLimit{Requests: 50}}}, NewDefaultPolicy(0.3),
		wi("a", 0), wi("a", 1), wi("b", 0), wi("c", 0))
	var wg sync.WaitGroup
	var mu sync.Mutex
	unexpected := []error{}
	note := func(err error) {
		if err == nil {
			return
		}
		for _, ok := range []error{ErrNoEligibleWorker, ErrNoCandidate, ErrOverloaded, ErrDeadline, ErrCanceled,
			ErrUnknownBooking, ErrUnknownRequest, ErrDuplicateRequest, ErrStaleFence, context.DeadlineExceeded, context.Canceled} {
			if errors.Is(err, ok) {
				return
			}
		}
		mu.Lock()
		unexpected = append(unexpected, err)
		mu.Unlock()
	}
	for g := range 6 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range rounds {
				r := &Request{ID: fmt.Sprint("g", g, "-", i%40), Tokens: 16 * (1 + rnd.IntN(10)), Priority: rnd.IntN(3),
					SeqHashes: hashes(rnd.IntN(2), uint64(rnd.IntN(3)))}
				switch rnd.IntN(4) {
				case 0:
					r.Pinned = &workerref.Target{Worker: []string{"a", "b", "c", "d"}[rnd.IntN(4)], AnyRank: true}
				case 1:
					r.Affinity = &Affinity{Target: workerref.Of("a", uint32(rnd.IntN(3))), Mode: session.Mode(1 + rnd.IntN(2))}
				}
				if rnd.IntN(4) == 0 {
					r.Deadline = time.Now().Add(time.Duration(rnd.IntN(3)) * time.Millisecond)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rnd.IntN(5))*time.Millisecond)
				d, err := s.Schedule(ctx, r)
				cancel()
				note(err)
				if err != nil {
					continue
				}
				// Hold the booking while others run: calls run on their
				// caller under the scheduler's lock, so without a yield the
				// bookings of the callers barely overlap and nothing queues.
				runtime.Gosched()
				if rnd.IntN(2) == 0 {
					note(s.PrefillDone(d.Fence))
				}
				if rnd.IntN(10) == 0 {
					note(s.Rollback(d.Fence))
				} else {
					note(s.Free(d.Fence))
				}
			}
		})
	}
	wg.Go(func() { // membership, remote events, reports, thresholds
		rnd := rand.New(rand.NewPCG(99, 1))
		for i := range rounds {
			switch rnd.IntN(5) {
			case 0:
				w := wi("d", 0)
				w.Available = rnd.IntN(2) == 0
				note(s.UpsertWorker(w))
			case 1:
				note(s.RemoveWorker("d"))
			case 2:
				note(s.ApplyRemote(BookingEvent{Replica: "peer", Kind: BookingKind(1 + rnd.IntN(3)), RequestID: fmt.Sprint("p", i%7),
					Worker: []string{"a", "b", "d"}[rnd.IntN(3)], Attempt: uint64(i % 3), PrefillTokens: 30, Blocks: 2}))
			case 3:
				note(s.ObserveLoad(LoadReport{Key: wk("b", 0), ActiveRequests: rnd.IntN(3), PrefillTokens: rnd.IntN(150)}))
			case 4:
				th := oneBatch()
				th.OverloadPrefillFrac = []float64{0, 1.5}[rnd.IntN(2)]
				note(s.SetThresholds(th))
			}
			_ = s.Cancel(fmt.Sprint("g0-", i%40))
			time.Sleep(50 * time.Microsecond)
		}
	})
	wg.Wait()
	if len(unexpected) > 0 {
		t.Fatalf("unexpected errors: %v", unexpected[:min(5, len(unexpected))])
	}
	// Settle: forget the peer and the reports, then nothing may be left.
	if err := s.do(func(c *core) {
		for k, rb := range c.remote {
			c.dropRemote(k, rb)
		}
		c.guard(c.cfg.Now().Add(time.Hour)) // expires report corrections (and any leaked booking)
	}); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	t.Logf("stats: %+v", st)
	if st.Admitted < uint64(rounds) || st.Queued == 0 {
		t.Fatalf("the stress did not stress: %+v", st)
	}
	if st.Waiting != 0 || st.Bookings != 0 || st.Expired != 0 {
		t.Fatalf("left behind: %+v", st)
	}
	ls, err := s.Loads(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.PrefillTokens != 0 || l.DecodeBlocks != 0 || l.ActiveRequests != 0 {
			t.Fatalf("load left on %+v", l)
		}
	}
	if err := s.do(func(c *core) {
		if c.holders.len() != 0 || len(c.q.byID) != 0 || c.q.dl.Len() != 0 || len(c.q.tiers) != 0 {
			t.Errorf("state left: holders %d queued %d deadlines %d tiers %d", c.holders.len(), len(c.q.byID), c.q.dl.Len(), len(c.q.tiers))
		}
	}); err != nil {
		t.Fatal(err)
	}
}
