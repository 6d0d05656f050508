package scheduler

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/workerref"
)

func bigWorker(name string) WorkerInfo {
	return WorkerInfo{Key: wk(name, 0), KVBlocks: 100000, MaxBatchedTokens: 100000, Available: true}
}

// Booking adds prefill tokens, decode blocks with shared prompt blocks
// counted once, and an active request; prefill-done and free take them off.
func TestBookingLoadAndSharedPrefix(t *testing.T) {
	var potential []int
	p := &recordingPolicy{pick: func(_ *Context, c *Candidates) int {
		potential = append(potential, c.PotentialDecodeBlocks(0))
		return 0
	}}
	h := newHarness(t, Config{}, p, bigWorker("a"))
	mk := func(id string) *Request {
		// 4 full blocks + 16 output tokens: 5 blocks, 4 of them named by hashes
		return &Request{ID: id, Tokens: 64, ExpectedOutput: 16, SeqHashes: hashes(4, 1)}
	}
	d1 := h.admitted(h.submit(mk("r1")))
	if l := h.loads()[wk("a", 0)]; l.PrefillTokens != 64 || l.DecodeBlocks != 5 || l.ActiveRequests != 1 {
		t.Fatalf("after r1: %+v", l)
	}
	d2 := h.admitted(h.submit(mk("r2")))
	if l := h.loads()[wk("a", 0)]; l.PrefillTokens != 128 || l.DecodeBlocks != 6 || l.ActiveRequests != 2 {
		t.Fatalf("after r2 (shared prefix counted once): %+v", l)
	}
	// r3 sees 6 booked + 5 of its own − 4 already active = 7.
	d3 := h.admitted(h.submit(mk("r3")))
	if potential[2] != 7 {
		t.Fatalf("potential decode blocks for r3 = %d, want 7 (first two: %v)", potential[2], potential[:2])
	}
	// Overlap reduces the booked prefill: 2 cached blocks of 4.
	d4 := h.admitted(h.submit(&Request{ID: "r4", Tokens: 64, SeqHashes: hashes(4, 2), Overlaps: []Overlap{{Key: wk("a", 0), Blocks: 2}}}))
	if l := h.loads()[wk("a", 0)]; l.PrefillTokens != 3*64+32 {
		t.Fatalf("after r4: %+v", l)
	}
	for _, f := range []Fence{d1.Fence, d2.Fence, d3.Fence} {
		if err := h.s.PrefillDone(f); err != nil {
			t.Fatal(err)
		}
		if err := h.s.PrefillDone(f); err != nil { // idempotent
			t.Fatal(err)
		}
	}
	if l := h.loads()[wk("a", 0)]; l.PrefillTokens != 32 || l.DecodeBlocks != 7+4 {
		t.Fatalf("after prefill done: %+v", l)
	}
	for _, f := range []Fence{d1.Fence, d2.Fence, d3.Fence, d4.Fence} {
		if err := h.s.Free(f); err != nil {
			t.Fatal(err)
		}
	}
	if l := h.loads()[wk("a", 0)]; l != (TargetLoad{Key: wk("a", 0), Available: true}) {
		t.Fatalf("after free: %+v", l)
	}
	if h.c.holders.len() != 0 || len(h.c.bookings) != 0 {
		t.Fatalf("leftover state: %d holders, %d bookings", h.c.holders.len(), len(h.c.bookings))
	}
}

// Lifecycle calls are fenced by (request, worker, attempt): a stale free
// from an earlier attempt cannot release a retry.
func TestBookingFences(t *testing.T) {
	h := newHarness(t, Config{}, nil, bigWorker("a"), bigWorker("b"))
	d1 := h.admitted(h.submit(&Request{ID: "r", Tokens: 10}))
	// A request id holds at most one booking.
	if res, _ := h.poll(h.submit(&Request{ID: "r", Tokens: 10})); !errors.Is(res.err, ErrDuplicateRequest) {
		t.Fatalf("duplicate: %v", res.err)
	}
	for _, bad := range []Fence{
		{RequestID: "r", Worker: d1.Fence.Worker, Attempt: d1.Fence.Attempt + 1},
		{RequestID: "r", Worker: wk("zz", 0), Attempt: d1.Fence.Attempt},
	} {
		if err := h.s.Free(bad); !errors.Is(err, ErrStaleFence) {
			t.Fatalf("free %v: %v", bad, err)
		}
	}
	// The dispatch failed: roll back, then retry.
	if err := h.s.Rollback(d1.Fence); err != nil {
		t.Fatal(err)
	}
	d2 := h.admitted(h.submit(&Request{ID: "r", Tokens: 10}))
	if d2.Fence.Attempt == d1.Fence.Attempt {
		t.Fatal("retry reused the attempt")
	}
	// Cleanup from the first attempt arrives late: it must not free the retry.
	if err := h.s.Free(d1.Fence); !errors.Is(err, ErrStaleFence) {
		t.Fatalf("stale free: %v", err)
	}
	if err := h.s.PrefillDone(d1.Fence); !errors.Is(err, ErrStaleFence) {
		t.Fatalf("stale prefill done: %v", err)
	}
	if l := h.loads()[d2.Worker]; l.ActiveRequests != 1 || l.LocalBookings != 1 {
		t.Fatalf("retry's booking disturbed: %+v", l)
	}
	if err := h.s.Free(d2.Fence); err != nil {
		t.Fatal(err)
	}
	if err := h.s.Free(d2.Fence); !errors.Is(err, ErrUnknownBooking) {
		t.Fatalf("double free: %v", err)
	}
	st := h.s.Stats()
	if st.Rollbacks != 1 || st.StaleFences != 4 || st.Bookings != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A booking untouched for BookingTTL is taken as vanished; PrefillDone
// restarts its clock.
func TestBookingExpiry(t *testing.T) {
	var events []BookingEvent
	h := newHarness(t, Config{OnBookingChange: func(ev BookingEvent) { events = append(events, ev) }}, nil, bigWorker("a"))
	d := h.admitted(h.submit(&Request{ID: "r", Tokens: 10}))
	h.clock.Advance(299 * time.Second)
	h.c.guard(h.clock.Now())
	if err := h.s.PrefillDone(d.Fence); err != nil {
		t.Fatalf("expired too early: %v", err)
	}
	h.clock.Advance(299 * time.Second)
	h.c.guard(h.clock.Now())
	if h.loads()[wk("a", 0)].ActiveRequests != 1 {
		t.Fatal("prefill-done did not renew the booking")
	}
	h.clock.Advance(2 * time.Second)
	h.c.guard(h.clock.Now())
	if l := h.loads()[wk("a", 0)]; l.ActiveRequests != 0 || l.DecodeBlocks != 0 {
		t.Fatalf("not expired: %+v", l)
	}
	if err := h.s.Free(d.Fence); !errors.Is(err, ErrUnknownBooking) {
		t.Fatalf("free after expiry: %v", err)
	}
	if h.s.Stats().Expired != 1 {
		t.Fatal("expiry not counted")
	}
	kinds := []string{}
	for _, ev := range events {
		kinds = append(kinds, ev.Kind.String())
	}
	if strings.Join(kinds, ",") != "add,prefill_done,free" {
		t.Fatalf("events %v", kinds)
	}
}

// Two replicas share load through booking events.
func TestReplicaLoadSharing(t *testing.T) {
	clock := newFakeClock()
	var r2 *harness
	r1 := newHarness(t, Config{Replica: "r1", Now: clock.Now, OnBookingChange: func(ev BookingEvent) {
		if err := r2.s.ApplyRemote(ev); err != nil {
			t.Error(err)
		}
	}}, nil, bigWorker("a"), bigWorker("b"))
	r2 = newHarness(t, Config{Replica: "r2", Now: clock.Now, MaxRemoteBookings: 2}, nil, bigWorker("a"), bigWorker("b"))

	d := r1.admitted(r1.submit(&Request{ID: "x", Tokens: 64, SeqHashes: hashes(4, 1), Pinned: new(workerref.Any("a"))}))
	if l := r2.loads()[wk("a", 0)]; l.PrefillTokens != 64 || l.DecodeBlocks != 4 || l.ActiveRequests != 1 || l.LocalBookings != 0 {
		t.Fatalf("remote add not applied: %+v", l)
	}
	// r2's default policy now avoids a.
	if d2 := r2.admitted(r2.submit(&Request{ID: "y", Tokens: 64})); d2.Worker != wk("b", 0) {
		t.Fatalf("r2 ignored r1's booking: %v", d2.Worker)
	}
	if err := r1.s.PrefillDone(d.Fence); err != nil {
		t.Fatal(err)
	}
	if l := r2.loads()[wk("a", 0)]; l.PrefillTokens != 0 || l.ActiveRequests != 1 {
		t.Fatalf("remote prefill-done: %+v", l)
	}
	// Duplicates and echoes are ignored.
	add := BookingEvent{Replica: "r1", Kind: BookingAdd, RequestID: "z", Worker: "a", Attempt: 9, PrefillTokens: 5, Blocks: 1}
	for range 2 {
		if err := r2.s.ApplyRemote(add); err != nil {
			t.Fatal(err)
		}
	}
	if err := r1.s.ApplyRemote(BookingEvent{Replica: "r1", Kind: BookingAdd, RequestID: "q", Worker: "a", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if l := r1.loads()[wk("a", 0)]; l.ActiveRequests != 1 {
		t.Fatalf("own echo applied: %+v", l)
	}
	if l := r2.loads()[wk("a", 0)]; l.ActiveRequests != 2 {
		t.Fatalf("duplicate add applied twice: %+v", l)
	}
	// Bounded: r2 holds at most 2 remote bookings.
	add.RequestID = "overflow"
	if err := r2.s.ApplyRemote(add); err != nil {
		t.Fatal(err)
	}
	if st := r2.s.Stats(); st.RemoteBookings != 2 || st.RemoteDropped != 1 {
		t.Fatalf("bound: %+v", st)
	}
	// A free with another attempt is ignored; the matching one releases.
	if err := r2.s.ApplyRemote(BookingEvent{Replica: "r1", Kind: BookingFree, RequestID: "z", Worker: "a", Attempt: 8}); err != nil {
		t.Fatal(err)
	}
	if r2.s.Stats().RemoteBookings != 2 {
		t.Fatal("stale remote free applied")
	}
	if err := r1.s.Free(d.Fence); err != nil {
		t.Fatal(err)
	}
	if l := r2.loads()[wk("a", 0)]; l.ActiveRequests != 1 || l.DecodeBlocks != 1 {
		t.Fatalf("remote free: %+v", l)
	}
	// Staleness is bounded: remote bookings expire after RemoteTTL.
	clock.Advance(300 * time.Second)
	r2.c.guard(clock.Now())
	if l := r2.loads()[wk("a", 0)]; l.ActiveRequests != 0 || l.PrefillTokens != 0 || l.DecodeBlocks != 0 {
		t.Fatalf("remote booking did not expire: %+v", l)
	}
	if st := r2.s.Stats(); st.RemoteExpired != 1 || st.RemoteBookings != 0 {
		t.Fatalf("%+v", st)
	}
	// Bad events are rejected and counted.
	if err := r2.s.ApplyRemote(BookingEvent{Replica: "r1", Kind: 9, RequestID: "z", Worker: "a"}); !errors.Is(err, ErrInvalidEvent) {
		t.Fatal(err)
	}
	// Unknown workers are ignored.
	if err := r2.s.ApplyRemote(BookingEvent{Replica: "r1", Kind: BookingAdd, RequestID: "u", Worker: "nope"}); err != nil {
		t.Fatal(err)
	}
	if r2.s.Stats().RemoteIgnored == 0 {
		t.Fatal("unknown worker not counted")
	}
}

func TestBookingEventJSON(t *testing.T) {
	ev := BookingEvent{Replica: "r1", Seq: 3, Kind: BookingPrefillDone, RequestID: "x", Worker: "w", Rank: 1, Attempt: 7,
		At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"replica":"r1","seq":3,"kind":"prefill_done","request_id":"x","worker":"w","rank":1,"attempt":7,"at":"2026-01-02T03:04:05Z"}`
	if string(b) != want {
		t.Fatalf("%s", b)
	}
	var back BookingEvent
	if err := json.Unmarshal(b, &back); err != nil || back != ev {
		t.Fatalf("%+v %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"kind":"nope"}`), &back); !errors.Is(err, ErrInvalidEvent) {
		t.Fatal(err)
	}
}

// Worker load reports correct drift: untracked load is added, stale remote
// bookings cancelled, our own bookings never cancelled; old reports are
// ignored and corrections lapse after LoadReportTTL.
func TestObserveLoadCorrectsDrift(t *testing.T) {
	h := newHarness(t, Config{}, nil, wi("a", 0))
	report := func(active, prefill, kv int, at time.Time) {
		t.Helper()
		if err := h.s.ObserveLoad(LoadReport{Key: wk("a", 0), ActiveRequests: active, PrefillTokens: prefill, KVUsedBlocks: kv, At: at}); err != nil {
			t.Fatal(err)
		}
	}
	report(3, 150, 40, h.clock.Now())
	if l := h.loads()[wk("a", 0)]; l.ActiveRequests != 3 || l.PrefillTokens != 150 || l.DecodeBlocks != 40 || !l.Busy {
		t.Fatalf("untracked load not added: %+v", l)
	}
	// An older report is ignored.
	report(0, 0, 0, h.clock.Now().Add(-time.Second))
	if h.loads()[wk("a", 0)].ActiveRequests != 3 {
		t.Fatal("older report applied")
	}
	// The correction lapses without fresh reports, and that drains the queue.
	waiter := h.submit(&Request{ID: "w", Tokens: 10})
	h.waiting(waiter)
	h.clock.Advance(10 * time.Second)
	h.c.guard(h.clock.Now())
	h.admitted(waiter)
	// A report below our own bookings does not cancel them...
	h.clock.Advance(time.Second)
	report(0, 0, 0, h.clock.Now())
	if l := h.loads()[wk("a", 0)]; l.ActiveRequests != 1 || l.PrefillTokens != 10 {
		t.Fatalf("own booking cancelled: %+v", l)
	}
	// ...but does cancel remote ones the worker never saw.
	if err := h.s.ApplyRemote(BookingEvent{Replica: "dead", Kind: BookingAdd, RequestID: "g", Worker: "a", Attempt: 1, PrefillTokens: 90, Blocks: 6}); err != nil {
		t.Fatal(err)
	}
	if l := h.loads()[wk("a", 0)]; l.ActiveRequests != 2 || !l.Busy {
		t.Fatalf("remote add: %+v", l)
	}
	h.clock.Advance(time.Second)
	report(1, 10, 1, h.clock.Now())
	if l := h.loads()[wk("a", 0)]; l.ActiveRequests != 1 || l.PrefillTokens != 10 || l.Busy {
		t.Fatalf("stale remote booking not cancelled: %+v", l)
	}
	if err := h.s.ObserveLoad(LoadReport{Key: wk("a", 0), ActiveRequests: -1}); !errors.Is(err, ErrInvalidWorker) {
		t.Fatal(err)
	}
	if err := h.s.ObserveLoad(LoadReport{Key: wk("zz", 0)}); err != nil || h.s.Stats().LoadIgnored != 2 {
		t.Fatalf("%v %+v", err, h.s.Stats())
	}
}

// Removing a worker drops its bookings and fails requests pinned to it.
func TestRemoveWorker(t *testing.T) {
	h := newHarness(t, Config{}, nil, wi("a", 0), wi("a", 1), wi("b", 0))
	d := h.admitted(h.submit(&Request{ID: "r", Tokens: 64, SeqHashes: hashes(4, 1), Pinned: new(workerref.Of("a", 1))}))
	h.admitted(h.submit(&Request{ID: "fill", Tokens: 100, Pinned: new(workerref.Of("a", 0))}))
	pinned := h.submit(&Request{ID: "p", Tokens: 100, Pinned: new(workerref.Of("a", 0))})
	h.waiting(pinned)
	if err := h.s.RemoveWorker("a"); err != nil {
		t.Fatal(err)
	}
	if res, ok := h.poll(pinned); !ok || !errors.Is(res.err, ErrNoEligibleWorker) {
		t.Fatalf("pinned waiter: %v", res.err)
	}
	if err := h.s.Free(d.Fence); !errors.Is(err, ErrUnknownBooking) {
		t.Fatal(err)
	}
	if h.c.holders.len() != 0 || h.s.Stats().Bookings != 0 {
		t.Fatalf("holders %d bookings %d", h.c.holders.len(), h.s.Stats().Bookings)
	}
	if ls := h.loads(); len(ls) != 1 {
		t.Fatalf("loads %v", ls)
	}
	// The name can come back with fresh state.
	if err := h.s.UpsertWorker(wi("a", 0)); err != nil {
		t.Fatal(err)
	}
	if l := h.loads()[wk("a", 0)]; l.ActiveRequests != 0 || l.PrefillTokens != 0 {
		t.Fatalf("reused slot carried load: %+v", l)
	}
	if err := h.s.UpsertWorker(WorkerInfo{Key: wk("c", 0), BlockSize: 32}); !errors.Is(err, ErrInvalidWorker) {
		t.Fatal(err)
	}
}

// A request whose prompt plus expected output exceeds the largest worker's
// KV blocks is refused before booking, naming the limit; one that fits the
// largest (not the smallest) worker is admitted; a worker of unknown
// capacity lifts the check.
func TestCapacityCheck(t *testing.T) {
	small := WorkerInfo{Key: wk("small", 0), KVBlocks: 100, Available: true}
	large := WorkerInfo{Key: wk("large", 0), KVBlocks: 4096, Available: true}
	h := newHarness(t, Config{BlockSize: 16}, &recordingPolicy{pick: preferWorker("large")}, small, large)
	for _, c := range []struct {
		name   string
		req    Request
		refuse bool
	}{
		{"expected output 2^24", Request{ID: "a", Tokens: 64, ExpectedOutput: 1 << 24}, true},
		{"input 2^21", Request{ID: "b", Tokens: 1 << 21}, true},
		{"one block past the largest", Request{ID: "c", Tokens: 4096*16 + 1}, true},
		{"exactly the largest", Request{ID: "d", Tokens: 4096*16 - 100, ExpectedOutput: 100}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, ok := h.poll(h.submit(&c.req))
			if !ok {
				t.Fatal("request still waiting")
			}
			var ce *CapacityError
			switch {
			case c.refuse && (!errors.As(res.err, &ce) || !errors.Is(res.err, ErrExceedsCapacity) || ce.MaxBlocks != 4096 ||
				!strings.Contains(res.err.Error(), "the largest worker holds 4096 blocks")):
				t.Fatalf("err = %v, want a CapacityError naming 4096 blocks", res.err)
			case !c.refuse && res.err != nil:
				t.Fatalf("err = %v, want admitted", res.err)
			}
		})
	}
	if l := h.loads()[wk("large", 0)]; l.ActiveRequests != 1 {
		t.Fatalf("large worker's load %+v: want only the request that fits", l)
	}
	h.s.mu.Lock()
	h.c.upsertWorker(WorkerInfo{Key: wk("unknown", 0), Available: true})
	h.s.mu.Unlock()
	if res, ok := h.poll(h.submit(&Request{ID: "e", Tokens: 1 << 21})); !ok || errors.Is(res.err, ErrExceedsCapacity) {
		t.Fatalf("with a worker of unknown capacity: %v (answered %v)", res.err, ok)
	}
}
