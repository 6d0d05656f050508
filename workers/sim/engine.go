package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// EventEmitter receives the cache events of one rank. *kvevents.Publisher
// satisfies it. Emit must not block for long (it is called under the rank's
// lock, from the step loop) and must not keep ev's slices after it returns:
// the engine reuses them. An error is counted (Stats.EmitErrors) and the
// engine goes on.
type EventEmitter interface {
	Emit(ev kvevents.Event) error
}

// EmitterFactory makes the emitter of one rank of one incarnation (epoch).
// The engine owns what it returns: if the emitter has a
// Close(context.Context) error method, the engine calls it when the
// incarnation ends (Restart, Close).
type EmitterFactory func(rank uint32, epoch uint64) (EventEmitter, error)

// DiscardEmitter drops every event.
type DiscardEmitter struct{}

// Emit does nothing.
func (DiscardEmitter) Emit(kvevents.Event) error { return nil }

type emitterCloser interface {
	Close(ctx context.Context) error
}

// Engine is one simulated worker: Ranks independent ranks, each a KV cache
// with a scheduler and a step loop. Create it with New, drive it with Run
// (real time or a VirtualClock) or RunUntilIdle (synchronous), feed it with
// Submit or Serve (NATS).
type Engine struct {
	cfg   Config
	ranks []*core
	epoch atomic.Uint64
	life  context.Context // cancelled by Close: stops Run's loops mid-step
	kill  context.CancelFunc

	lifeMu  sync.Mutex // serialises Restart and Close
	closed  atomic.Bool
	running atomic.Bool // Run or RunUntilIdle active
	nextID  atomic.Uint64
}

// New builds an engine and makes the emitters of its first epoch.
func New(cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg}
	e.life, e.kill = context.WithCancel(context.Background())
	epoch := cfg.NewEpoch()
	ems, err := e.makeEmitters(epoch)
	if err != nil {
		return nil, err
	}
	e.epoch.Store(epoch)
	for i := range cfg.Ranks {
		e.ranks = append(e.ranks, newCore(&e.cfg, uint32(i), ems[i]))
	}
	return e, nil
}

func (e *Engine) makeEmitters(epoch uint64) ([]EventEmitter, error) {
	ems := make([]EventEmitter, e.cfg.Ranks)
	for i := range ems {
		if e.cfg.NewEmitter == nil {
			ems[i] = DiscardEmitter{}
			continue
		}
		em, err := e.cfg.NewEmitter(uint32(i), epoch)
		if err != nil {
			closeEmitters(context.Background(), ems[:i])
			return nil, fmt.Errorf("sim: emitter for %s rank %d epoch %d: %w", e.cfg.Worker, i, epoch, err)
		}
		ems[i] = em
	}
	return ems, nil
}

func closeEmitters(ctx context.Context, ems []EventEmitter) error {
	var errs []error
	for _, em := range ems {
		if c, ok := em.(emitterCloser); ok {
			if err := c.Close(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Epoch is the current incarnation's epoch.
func (e *Engine) Epoch() uint64 { return e.epoch.Load() }

// Endpoint is the NATS subject the engine serves generate requests on.
func (e *Engine) Endpoint() string { return GenerateSubject(e.cfg.Prefix, e.cfg.Model, e.cfg.Worker) }

// Keys returns the (worker, rank) keys of the engine's ranks.
func (e *Engine) Keys() []workerref.Target {
	out := make([]workerref.Target, len(e.ranks))
	for i, c := range e.ranks {
		out[i] = c.key
	}
	return out
}

// Submit queues a request on its rank and returns its stream. The request is
// cancelled when ctx ends. Errors: ErrBadRank, ErrEmptyPrompt,
// ErrBadMaxTokens, ErrBadMedia, ErrTooLong, ErrDuplicateRequest, ErrClosed.
func (e *Engine) Submit(ctx context.Context, req Request) (*Stream, error) {
	if e.closed.Load() {
		return nil, ErrClosed
	}
	if int(req.Rank) >= len(e.ranks) {
		return nil, fmt.Errorf("%w: rank %d of %d on %s", ErrBadRank, req.Rank, len(e.ranks), e.cfg.Worker)
	}
	if len(req.Tokens) == 0 {
		return nil, ErrEmptyPrompt
	}
	if req.MaxTokens < 1 {
		return nil, fmt.Errorf("%w: got %d", ErrBadMaxTokens, req.MaxTokens)
	}
	if err := checkMedia(req.Media, len(req.Tokens)); err != nil {
		return nil, err
	}
	c := e.ranks[req.Rank]
	// The whole sequence (the last token is never fed back) must fit next to
	// the admission watermark, or the request could never run.
	if blocks := c.blocksFor(len(req.Tokens) + req.MaxTokens - 1); blocks > c.cfg.KVBlocks-c.wmark {
		return nil, fmt.Errorf("%w: %d prompt + %d output tokens need %d blocks of %d, rank has %d (less %d watermark)",
			ErrTooLong, len(req.Tokens), req.MaxTokens, blocks, c.cfg.BlockSize, c.cfg.KVBlocks, c.wmark)
	}
	id := req.ID
	if id == "" {
		id = "sim-" + strconv.FormatUint(e.nextID.Add(1), 10)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	tokens := make([]uint32, len(req.Tokens), len(req.Tokens)+req.MaxTokens)
	copy(tokens, req.Tokens)
	r := &request{
		id:          id,
		seed:        kvevents.SeedFor(req.LoRA, req.CacheSalt),
		outSeed:     outputSeed(id),
		vocab:       req.Vocab,
		lora:        req.LoRA,
		loraID:      req.LoRAID,
		salt:        req.CacheSalt,
		media:       req.Media,
		tokens:      tokens,
		promptLen:   len(tokens),
		transferred: req.Transferred,
		maxTokens:   req.MaxTokens,
		stream:      newStream(id),
		// Sized for the whole sequence: the step loop then never grows them.
		blocks: make([]int32, 0, c.blocksFor(cap(tokens))),
		hashes: make([]kvevents.SeqHash, 0, cap(tokens)/c.cfg.BlockSize),
	}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if _, dup := c.byID[id]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrDuplicateRequest, id)
	}
	r.arrival = c.clock.Now()
	if !req.Arrival.IsZero() {
		if req.Arrival.After(r.arrival) {
			c.mu.Unlock()
			return nil, fmt.Errorf("%w: %v is after %v on %s rank %d", ErrFutureArrival, req.Arrival, r.arrival, c.key.Worker, c.key.Rank)
		}
		r.arrival = req.Arrival
	}
	c.byID[id] = r
	c.waiting = append(c.waiting, r)
	if ctx.Done() != nil {
		r.stopAfter = context.AfterFunc(ctx, func() { c.cancel(r) })
	}
	c.mu.Unlock()
	c.signal()
	return r.stream, nil
}

// Run drives every rank's step loop until ctx ends or Close is called. Each
// step takes its model time divided by the speed-up on the clock. It returns
// nil after Close, ctx.Err() otherwise.
func (e *Engine) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: engine %s is driven by Run, RunUntilIdle or AdvanceTo", ErrRunning, e.cfg.Worker)
	}
	defer e.running.Store(false)
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.life, cancel)
	defer stop()
	var wg sync.WaitGroup
	for _, c := range e.ranks {
		wg.Go(func() { c.loop(ctx) })
	}
	wg.Wait()
	if e.closed.Load() {
		return nil
	}
	return outer.Err()
}

// RunUntilIdle runs steps synchronously, rank after rank, until no rank has
// work left (or ctx ends). With a VirtualClock it is a deterministic
// discrete-event simulation; do not use it while Run is active.
func (e *Engine) RunUntilIdle(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: engine %s is driven by Run, RunUntilIdle or AdvanceTo", ErrRunning, e.cfg.Worker)
	}
	defer e.running.Store(false)
	for {
		any := false
		for _, c := range e.ranks {
			did, err := c.stepOnce(ctx)
			if err != nil {
				return err
			}
			any = any || did
		}
		if !any {
			return nil
		}
	}
}

// ErrNotVirtual: AdvanceTo needs the engine to run on a VirtualClock.
var ErrNotVirtual = errors.New("sim: engine clock is not a *VirtualClock")

// AdvanceTo runs the engine synchronously on virtual time until t, for
// deterministic discrete-event simulations of many engines (a trace replay
// submits each request after advancing every engine to its arrival time).
// Each rank steps while it has work and its clock is before t; a step that
// starts before t completes even if it ends after t, as on a GPU. An idle
// rank's clock then jumps to t. It needs Config.Clock to be a *VirtualClock
// (ranks beyond the first keep their own copies); do not use it while Run is
// active.
func (e *Engine) AdvanceTo(ctx context.Context, t time.Time) error {
	if _, ok := e.cfg.Clock.(*VirtualClock); !ok {
		return ErrNotVirtual
	}
	if !e.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: engine %s is driven by Run, RunUntilIdle or AdvanceTo", ErrRunning, e.cfg.Worker)
	}
	defer e.running.Store(false)
	for _, c := range e.ranks {
		if err := c.advanceTo(ctx, c.clock.(*VirtualClock), t); err != nil {
			return err
		}
	}
	return nil
}

// Now is the engine's time: its clock's (rank 0's for a VirtualClock).
func (e *Engine) Now() time.Time { return e.ranks[0].clock.Now() }

// Restart simulates a worker restart: every request in flight fails with
// ErrRestarted, every rank's cache is emptied, a new epoch begins with new
// emitters (from Config.NewEmitter), and each rank emits Cleared as the
// first event of the new epoch. The old emitters are closed afterwards.
// Registration of the new epoch is the caller's (see Fleet).
func (e *Engine) Restart(ctx context.Context) error {
	e.lifeMu.Lock()
	defer e.lifeMu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	epoch := e.cfg.NewEpoch()
	for epoch == e.epoch.Load() {
		epoch = e.cfg.NewEpoch()
	}
	ems, err := e.makeEmitters(epoch)
	if err != nil {
		return err
	}
	old := make([]EventEmitter, len(e.ranks))
	for i, c := range e.ranks {
		c.mu.Lock()
		c.failAll(ErrRestarted)
		old[i] = c.emitter
		c.emitter = ems[i]
		c.clear()
		c.lora.resident = c.lora.resident[:0] // a new process has loaded no adapter
		c.mu.Unlock()
		c.signal()
	}
	e.epoch.Store(epoch)
	return closeEmitters(ctx, old)
}

// Reset empties every rank's prefix cache within the same epoch (vLLM's
// reset_prefix_cache) and emits Cleared. It fails with ErrBusy while any
// request is queued or running.
func (e *Engine) Reset() error {
	e.lifeMu.Lock()
	defer e.lifeMu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	for _, c := range e.ranks {
		c.mu.Lock()
	}
	defer func() {
		for _, c := range e.ranks {
			c.mu.Unlock()
		}
	}()
	for _, c := range e.ranks {
		if c.busy() {
			return fmt.Errorf("%w: %s rank %d has %d running, %d waiting", ErrBusy, c.key.Worker, c.key.Rank, len(c.running), len(c.waiting))
		}
	}
	for _, c := range e.ranks {
		c.clear()
	}
	return nil
}

// Reannounce re-emits the whole cache of every rank, in the current epoch:
// Cleared, then Stored events for every cached block, parents first. Use it
// when routers have dropped what they knew about this worker while it kept
// running (workers.RegistryConfig.OnRecreate: its registry key had expired
// and was created again); Fleet wires it there.
func (e *Engine) Reannounce() {
	for _, c := range e.ranks {
		c.mu.Lock()
		c.reannounce()
		c.mu.Unlock()
	}
}

// Idle reports whether no request is queued or running on any rank.
func (e *Engine) Idle() bool { return e.InFlight() == 0 }

// Close stops the step loops, fails what is still in flight with ErrClosed,
// emits Cleared on every rank (the cache is gone) and closes the emitters.
// Later calls return nil.
func (e *Engine) Close(ctx context.Context) error {
	e.lifeMu.Lock()
	defer e.lifeMu.Unlock()
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.kill()
	ems := make([]EventEmitter, len(e.ranks))
	for i, c := range e.ranks {
		c.mu.Lock()
		c.closed = true
		c.failAll(ErrClosed)
		c.clear()
		ems[i] = c.emitter
		c.emitter = DiscardEmitter{}
		c.mu.Unlock()
	}
	return closeEmitters(ctx, ems)
}

// Dump returns the exact set of sequence hashes cached on each rank, sorted:
// the ground truth a router index fed by this engine's events must equal.
func (e *Engine) Dump() map[workerref.Target][]kvevents.SeqHash {
	out := make(map[workerref.Target][]kvevents.SeqHash, len(e.ranks))
	for _, c := range e.ranks {
		c.mu.Lock()
		out[c.key] = c.cache.hashes()
		c.mu.Unlock()
	}
	return out
}

// Stats returns each rank's counters.
func (e *Engine) Stats() []Stats {
	out := make([]Stats, len(e.ranks))
	for i, c := range e.ranks {
		c.mu.Lock()
		out[i] = c.stats
		c.mu.Unlock()
	}
	return out
}
