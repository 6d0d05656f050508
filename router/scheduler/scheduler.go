package scheduler

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// core is the scheduler's state. It is owned by one goroutine at a time:
// the caller of a method before Start, the actor after it.
type core struct {
	cfg    Config
	th     Thresholds
	fl     *fleet
	policy Policy
	rng    rng
	// seq counts selections per request leg: round robin then cycles each
	// leg's candidates on its own (one shared counter would send a split
	// request's two legs, two selections apart, to every other worker).
	seq     [numLegs]uint64
	attempt uint64
	evSeq   uint64
	// share estimates the cached share of the prompts routed here
	// (cachedshare.go), handed to policies as Context.CachedShare.
	share cachedShare
	// held is the share of recent selections whose request had waited in
	// the queue (cachedshare.go), handed to policies as Context.HeldShare.
	held heldShare

	bookings map[string]*booking
	holders  holderTable // per-hash refcounts of active prompt blocks (holders.go)
	hashPool [][]kvevents.SeqHash
	remote   map[remoteKey]*remoteBooking

	q       queueState
	pumping bool

	// selection scratch
	x         Context
	cands     Candidates
	shared    []int32
	shTouched []int32

	noOutput     bool // the policy books prompt blocks only (OutputBlockTracker)
	bookedPrefix bool // a prefix booked on a worker counts as cached (BookedPrefixCounter)
	// bookedOnlyNew: only past every worker's reported overlap
	// (DefaultPolicy.BookedPrefixOnlyNew)
	bookedOnlyNew bool

	invBS   float64 // 1 / BlockSize
	bsShift int     // log2(BlockSize) when a power of two, else −1

	defaultPolicy *DefaultPolicy // policy, when it is the builtin default (called directly)

	stats    *counters
	onChange func() func(BookingEvent)
	setTimer func(at time.Time)          // the actor's deadline timer
	onAdmit  func(w *waiter, slot int32) // test hook
}

func newCore(cfg Config, p Policy, st *counters) *core {
	c := &core{
		cfg:      cfg,
		th:       cfg.Thresholds,
		fl:       newFleet(),
		policy:   p,
		bookings: map[string]*booking{},
		holders:  newHolderTable(),
		remote:   map[remoteKey]*remoteBooking{},
		q:        newQueueState(),
		stats:    st,
		onChange: func() func(BookingEvent) { return nil },
	}
	c.defaultPolicy, _ = p.(*DefaultPolicy)
	if t, ok := p.(OutputBlockTracker); ok {
		c.noOutput = !t.TracksOutputBlocks()
	}
	if t, ok := p.(BookedPrefixCounter); ok {
		c.bookedPrefix = t.CountsBookedPrefix()
	}
	c.bookedOnlyNew = c.bookedPrefix && c.defaultPolicy != nil && c.defaultPolicy.BookedPrefixOnlyNew
	c.invBS = 1 / float64(cfg.BlockSize)
	c.bsShift = -1
	if bs := cfg.BlockSize; bs&(bs-1) == 0 {
		c.bsShift = bits.TrailingZeros(uint(bs))
	}
	seed, ok := cfg.Seed, cfg.HasSeed
	if !ok {
		if sp, isSeeded := p.(Seeded); isSeeded {
			seed, ok = sp.Seed()
		}
	}
	if !ok {
		seed = randomSeed()
	}
	c.rng = rng{s: seed}
	return c
}

// Scheduler is one replica's admission point: the queue, eligibility, the
// pin rule, the policy and load booking. Create with New, run with Start.
//
// Every call runs on its caller's goroutine under mu, the one lock of the
// core: admit, select and book are serialised as they would be in an actor
// (two selections never both see a worker's spare capacity, booking events
// leave in order), without handing each request to another goroutine and
// back. The goroutine Start runs only fires the deadline timer and the
// guard, under the same lock.
type Scheduler struct {
	cfg   Config
	th    atomic.Pointer[Thresholds]
	stats counters
	c     *core
	fn    atomic.Pointer[func(BookingEvent)]

	mu      sync.Mutex // guards the core, started and closed
	started bool
	closed  bool
	done    chan struct{} // closed once closed and queued requests failed
	stop    chan struct{} // closed by Close: the timer goroutine exits
	wg      sync.WaitGroup
}

type opcode uint8

const (
	opSchedule opcode = iota + 1
	opAbandon
	opPrefillDone
	opServeWhole
	opFree
	opRollback
	opCancel
	opUpsert
	opRemove
	opLoad
	opRemote
	opThresholds
	opGuard
	opSnapshot
	opFunc
)

type command struct {
	op    opcode
	w     *waiter
	fence Fence
	id    string
	info  WorkerInfo
	load  LoadReport
	ev    BookingEvent
	fn    func(*core)
	whole bool // opServeWhole
	loads *[]TargetLoad
}

// New checks cfg, applies defaults and returns a scheduler that is not yet
// running. p nil means the default policy at temperature 0.
func New(cfg Config, p Policy) (*Scheduler, error) {
	full, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if p == nil {
		p = NewDefaultPolicy(0)
	}
	s := &Scheduler{
		cfg:  full,
		done: make(chan struct{}),
		stop: make(chan struct{}),
	}
	th := full.Thresholds
	s.th.Store(&th)
	s.c = newCore(full, p, &s.stats)
	s.c.onChange = func() func(BookingEvent) {
		if f := s.fn.Load(); f != nil {
			return *f
		}
		return nil
	}
	if full.OnBookingChange != nil {
		s.OnBookingChange(full.OnBookingChange)
	}
	return s, nil
}

// Replica is this scheduler's replica id (the one stamped on its events).
func (s *Scheduler) Replica() string { return s.cfg.Replica }

// Policy is the policy in use.
func (s *Scheduler) Policy() Policy { return s.c.policy }

// OnBookingChange sets the function that receives this replica's booking
// changes (for the host to publish to other replicas). It is called under
// the scheduler's lock, in order, and must not block nor call the
// scheduler: hand the event to a bounded buffer.
func (s *Scheduler) OnBookingChange(fn func(BookingEvent)) {
	if fn == nil {
		s.fn.Store(nil)
		return
	}
	s.fn.Store(&fn)
}

// Start runs the deadline timer and the guard until ctx is done or Close
// is called; from then on Schedule admits requests.
func (s *Scheduler) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.started {
		return fmt.Errorf("scheduler: already started")
	}
	s.started = true
	c := s.c
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	c.setTimer = func(at time.Time) {
		timer.Stop()
		if !at.IsZero() {
			timer.Reset(max(0, at.Sub(c.cfg.Now())))
		}
	}
	c.rearm()
	s.wg.Add(1)
	go s.run(ctx, timer)
	return nil
}

// Close stops the scheduler; queued requests fail with ErrClosed, and so
// does every later call. It waits for the timer goroutine to exit and is
// safe to call more than once.
func (s *Scheduler) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closeLocked()
	close(s.stop)
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// closeLocked fails everything still queued and refuses every later call.
// The caller holds mu.
func (s *Scheduler) closeLocked() {
	s.closed = true
	c := s.c
	for _, w := range c.q.byID {
		c.reject(w, ErrClosed)
	}
	if c.setTimer != nil {
		c.setTimer(time.Time{})
	}
	close(s.done)
}

// run fires the deadline timer and the guard until ctx is done or Close.
func (s *Scheduler) run(ctx context.Context, timer *time.Timer) {
	defer s.wg.Done()
	guard := time.NewTicker(s.cfg.GuardInterval)
	defer guard.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			if !s.closed {
				s.closeLocked()
			}
			s.mu.Unlock()
			return
		case <-s.stop:
			return
		case <-timer.C:
			_ = s.call(command{op: opFunc, fn: func(c *core) { c.expireDeadlines(c.cfg.Now()) }})
		case <-guard.C:
			_ = s.call(command{op: opGuard})
		}
	}
}

// exec runs one command on the core. The caller holds mu.
func (s *Scheduler) exec(cmd command) error {
	c := s.c
	switch cmd.op {
	case opSchedule:
		c.submit(cmd.w)
	case opAbandon:
		c.abandon(cmd.w)
	case opPrefillDone:
		return c.prefillDone(cmd.fence)
	case opServeWhole:
		return c.serveWhole(cmd.fence, cmd.whole)
	case opFree:
		return c.free(cmd.fence, false)
	case opRollback:
		return c.free(cmd.fence, true)
	case opCancel:
		return c.cancel(cmd.id)
	case opUpsert:
		c.upsertWorker(cmd.info)
	case opRemove:
		c.removeWorker(cmd.id)
	case opLoad:
		c.observeLoad(cmd.load)
	case opRemote:
		return c.applyRemote(cmd.ev)
	case opThresholds:
		c.th = *s.th.Load()
		c.fl.refreshAll(&c.th)
		c.pump()
	case opGuard:
		c.guard(c.cfg.Now())
	case opSnapshot:
		*cmd.loads = c.snapshot()
	case opFunc:
		cmd.fn(c)
	}
	return nil
}

// call runs cmd on the core under mu and returns its result; after Close
// it answers ErrClosed. Before Start it runs all the same, so direct calls
// are serialised as they are afterwards.
func (s *Scheduler) call(cmd command) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return s.exec(cmd)
}

// waiterPool holds waiters of calls answered at once (never queued).
var waiterPool = sync.Pool{New: func() any { return new(waiter) }}

// Schedule admits r, waiting in the router's queue while every worker it
// may use is busy, picks a worker under the pin rule and the policy, and
// books the predicted load there. The caller must not modify r until
// Schedule returns. On ctx expiry a queued request leaves the queue and a
// booking made in the meantime is rolled back.
func (s *Scheduler) Schedule(ctx context.Context, r *Request) (Decision, error) {
	if err := s.validate(r); err != nil {
		s.stats.badInput.Add(1)
		return Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("scheduler: request %q: %w", r.ID, err)
	}
	w := waiterPool.Get().(*waiter)
	w.req, w.dlIndex = r, -1
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		waiterPool.Put(w)
		return Decision{}, ErrClosed
	case !s.started:
		s.mu.Unlock()
		waiterPool.Put(w)
		return Decision{}, ErrNotStarted
	}
	s.c.submit(w)
	s.mu.Unlock()
	if w.answered {
		// Admitted or refused at once, on this goroutine: the common case.
		// Nothing else holds w then (it was never queued), so it is reused.
		res := w.res
		*w = waiter{}
		waiterPool.Put(w)
		return res.d, res.err
	}
	// Queued: the call that frees capacity admits w and answers on w.reply
	// (made when w was queued, under mu).
	select {
	case res := <-w.reply:
		return res.d, res.err
	case <-s.done:
		select {
		case res := <-w.reply:
			return res.d, res.err
		default:
			return Decision{}, ErrClosed
		}
	case <-ctx.Done():
		// Under mu the queue decides: leave it, or roll back a booking
		// made in the meantime. Its answer is final, so the reply is dropped.
		if err := s.call(command{op: opAbandon, w: w}); err != nil && err != ErrClosed {
			return Decision{}, err
		}
		return Decision{}, fmt.Errorf("scheduler: request %q: %w", r.ID, ctx.Err())
	}
}

func (s *Scheduler) validate(r *Request) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidRequest}, a...)...)
	}
	switch {
	case r == nil:
		return bad("nil request")
	case r.ID == "":
		return bad("empty request id")
	case r.Tokens < 0 || r.ExpectedOutput < 0:
		return bad("request %q: tokens %d, expected output %d", r.ID, r.Tokens, r.ExpectedOutput)
	case len(r.SeqHashes) > r.Tokens/s.cfg.BlockSize && len(r.SeqHashes) > 0:
		return bad("request %q: %d seq hashes for %d tokens at block size %d", r.ID, len(r.SeqHashes), r.Tokens, s.cfg.BlockSize)
	case s.cfg.Model != "" && r.Model != "" && r.Model != s.cfg.Model:
		return bad("request %q: model %q, scheduler serves %q", r.ID, r.Model, s.cfg.Model)
	case r.Pinned != nil && r.Pinned.Worker == "":
		return bad("request %q: pinned target with empty worker", r.ID)
	}
	if a := r.Affinity; a != nil {
		if a.Target.Worker == "" {
			return bad("request %q: affinity target with empty worker", r.ID)
		}
		if !a.Mode.Valid() {
			return bad("request %q: affinity mode %s", r.ID, a.Mode)
		}
	}
	for _, o := range r.Overlaps {
		if o.Blocks < 0 || o.Reported < 0 || o.Reported > o.Blocks {
			return bad("request %q: overlap %d blocks (%d reported) on %s", r.ID, o.Blocks, o.Reported, o.Key)
		}
	}
	return nil
}

// PrefillDone releases the request's prefill tokens (first token seen).
func (s *Scheduler) PrefillDone(f Fence) error { return s.call(command{op: opPrefillDone, fence: f}) }

// ServeWhole tells the scheduler whether the decode leg booked as f
// (Request.Leg) serves the whole request: whole when a PD route ends with
// its worker computing the prompt (the single-worker outcomes), so its
// uncached prompt tokens count as that worker's prefill; not whole when
// the route splits, so they do not (its engine pulls them). A decode-only
// worker's decode leg is booked as not whole, any other as whole.
func (s *Scheduler) ServeWhole(f Fence, whole bool) error {
	return s.call(command{op: opServeWhole, fence: f, whole: whole})
}

// Free releases the request's booking (end of stream).
func (s *Scheduler) Free(f Fence) error { return s.call(command{op: opFree, fence: f}) }

// Rollback releases a booking whose dispatch failed.
func (s *Scheduler) Rollback(f Fence) error { return s.call(command{op: opRollback, fence: f}) }

// Cancel fails a queued request with ErrCanceled, or frees a booked one.
func (s *Scheduler) Cancel(requestID string) error {
	return s.call(command{op: opCancel, id: requestID})
}

// UpsertWorker registers or updates a (worker, rank). Asynchronous after
// Start (applied in order with every other call).
func (s *Scheduler) UpsertWorker(w WorkerInfo) error {
	if w.Key.Worker == "" {
		return fmt.Errorf("%w: empty worker name", ErrInvalidWorker)
	}
	if w.BlockSize != 0 && w.BlockSize != s.cfg.BlockSize {
		return fmt.Errorf("%w: %s block size %d, scheduler uses %d", ErrInvalidWorker, w.Key, w.BlockSize, s.cfg.BlockSize)
	}
	if w.KVBlocks < 0 || w.MaxBatchedTokens < 0 || w.MaxSeqs < 0 {
		return fmt.Errorf("%w: %s kv blocks %d, max batched tokens %d, max seqs %d", ErrInvalidWorker, w.Key,
			w.KVBlocks, w.MaxBatchedTokens, w.MaxSeqs)
	}
	return s.call(command{op: opUpsert, info: w})
}

// RemoveWorker forgets every rank of a worker: its bookings are dropped
// (later lifecycle calls for them return ErrUnknownBooking), queued requests
// pinned to it fail with ErrNoEligibleWorker.
func (s *Scheduler) RemoveWorker(worker string) error {
	return s.call(command{op: opRemove, id: worker})
}

// ObserveLoad folds a worker's own load report in (asynchronous).
func (s *Scheduler) ObserveLoad(r LoadReport) error {
	if r.ActiveRequests < 0 || r.WaitingRequests < 0 || r.KVUsedBlocks < 0 || r.KVTotalBlocks < 0 || r.PrefillTokens < 0 {
		s.stats.badInput.Add(1)
		return fmt.Errorf("%w: load report for %s has a negative field: %+v", ErrInvalidWorker, r.Key, r)
	}
	return s.call(command{op: opLoad, load: r})
}

// ApplyRemote folds another replica's booking change in (asynchronous).
// Own echoes are ignored by replica id.
func (s *Scheduler) ApplyRemote(ev BookingEvent) error {
	if ev.Replica == "" || ev.RequestID == "" || ev.Worker == "" || ev.Kind < BookingAdd || ev.Kind > BookingFree {
		s.stats.badInput.Add(1)
		return fmt.Errorf("%w: replica %q request %q worker %q kind %s", ErrInvalidEvent, ev.Replica, ev.RequestID, ev.Worker, ev.Kind)
	}
	if ev.Replica == s.cfg.Replica {
		s.stats.remoteEchoes.Add(1)
		return nil
	}
	return s.call(command{op: opRemote, ev: ev})
}

// SetThresholds replaces the busy/overload thresholds atomically; the actor
// re-evaluates every worker and drains the queue if that frees capacity.
func (s *Scheduler) SetThresholds(t Thresholds) error {
	if err := t.validate(); err != nil {
		return err
	}
	s.th.Store(&t)
	return s.call(command{op: opThresholds})
}

// Thresholds returns the thresholds in force.
func (s *Scheduler) Thresholds() Thresholds { return *s.th.Load() }

// TargetLoad is one entry of the scheduler's load view: the state and
// predicted load of one (worker, rank) as the scheduler sees it.
type TargetLoad struct {
	Key            workerref.Target
	Available      bool
	Overloaded     bool
	Busy           bool
	PrefillTokens  int // effective: local + remote bookings + report correction
	DecodeBlocks   int
	ActiveRequests int
	LocalBookings  int
}

// Loads returns the load view, sorted by (worker, rank).
func (s *Scheduler) Loads(ctx context.Context) ([]TargetLoad, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []TargetLoad
	if err := s.call(command{op: opSnapshot, loads: &out}); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *core) snapshot() []TargetLoad {
	fl := c.fl
	per := map[int32]int{}
	for _, b := range c.bookings {
		per[b.slot]++
	}
	out := make([]TargetLoad, 0, len(fl.order))
	for _, s := range fl.order {
		out = append(out, TargetLoad{
			Key: fl.key[s], Available: fl.flags[s]&fAvail != 0, Overloaded: fl.flags[s]&fOverloaded != 0,
			Busy: fl.flags[s]&fBusy != 0, PrefillTokens: int(fl.prefill[s]), DecodeBlocks: int(fl.decode[s]),
			ActiveRequests: int(fl.active[s]), LocalBookings: per[s],
		})
	}
	return out
}

func (c *core) upsertWorker(info WorkerInfo) {
	c.fl.upsert(info, &c.th)
	if !info.Available {
		c.recheck()
	}
	c.pump()
}

func (c *core) removeWorker(name string) {
	freed := c.fl.remove(name, nil)
	if len(freed) == 0 {
		return
	}
	gone := func(slot int32) bool { return slices.Contains(freed, slot) }
	ids := make([]string, 0)
	for id, b := range c.bookings {
		if gone(b.slot) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	now := c.cfg.Now()
	for _, id := range ids {
		c.release(c.bookings[id], now, true)
	}
	for k, rb := range c.remote {
		if gone(rb.slot) {
			delete(c.remote, k)
		}
	}
	c.stats.remoteBookings.Store(int64(len(c.remote)))
	c.recheck()
	c.pump()
}

// Stats are cumulative counters and current gauges.
type Stats struct {
	Admitted, Queued                                    uint64 // admitted; ever queued
	Waiting, Bookings, RemoteBookings                   int64  // now
	RejectedOverloaded, RejectedDeadline, NoEligible    uint64
	PinConflicts, Canceled, Rollbacks, Expired          uint64
	StaleFences, HardFallbacks, PolicyErrors            uint64
	Refreshes, RemoteEchoes, RemoteIgnored              uint64
	RemoteDropped, RemoteExpired, LoadIgnored, BadInput uint64
	// CachedShare is the running estimate of the share of the prompt
	// blocks lately routed that the chosen worker already held
	// (cachedshare.go; Context.CachedShare), 1 before the first selection.
	CachedShare float64
}

type counters struct {
	admitted, queued                                    atomic.Uint64
	waiting, bookings, remoteBookings                   atomic.Int64
	overloaded, deadlines, noEligible                   atomic.Uint64
	pinConflicts, canceled, rollbacks, expired          atomic.Uint64
	staleFences, hardFallbacks, policyErrors            atomic.Uint64
	refreshes, remoteEchoes, remoteIgnored              atomic.Uint64
	remoteDropped, remoteExpired, loadIgnored, badInput atomic.Uint64
	uncachedShare                                       atomic.Uint64 // float64 bits of 1 - CachedShare, so that the zero value reads 1
}

// Stats returns a snapshot of the counters (safe from any goroutine).
func (s *Scheduler) Stats() Stats {
	c := &s.stats
	return Stats{
		Admitted: c.admitted.Load(), Queued: c.queued.Load(),
		Waiting: c.waiting.Load(), Bookings: c.bookings.Load(), RemoteBookings: c.remoteBookings.Load(),
		RejectedOverloaded: c.overloaded.Load(), RejectedDeadline: c.deadlines.Load(), NoEligible: c.noEligible.Load(),
		PinConflicts: c.pinConflicts.Load(), Canceled: c.canceled.Load(), Rollbacks: c.rollbacks.Load(),
		Expired: c.expired.Load(), StaleFences: c.staleFences.Load(), HardFallbacks: c.hardFallbacks.Load(),
		PolicyErrors: c.policyErrors.Load(), Refreshes: c.refreshes.Load(), RemoteEchoes: c.remoteEchoes.Load(),
		RemoteIgnored: c.remoteIgnored.Load(), RemoteDropped: c.remoteDropped.Load(),
		RemoteExpired: c.remoteExpired.Load(), LoadIgnored: c.loadIgnored.Load(), BadInput: c.badInput.Load(),
		CachedShare: 1 - math.Float64frombits(c.uncachedShare.Load()),
	}
}

// do runs fn on the core under the scheduler's lock (tests).
func (s *Scheduler) do(fn func(*core)) error { return s.call(command{op: opFunc, fn: fn}) }
