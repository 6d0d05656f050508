package sim

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/zeebo/xxh3"
)

type reqState uint8

const (
	stateWaiting reqState = iota
	stateRunning
	stateDone
)

// request is one request inside a rank, in vLLM v1's unified form: tokens
// holds the prompt followed by every generated token, computed counts the
// tokens whose KV is in the request's blocks, and a step schedules
// len(tokens)-computed of them (cut to the step's budget). When computed
// reaches len(tokens) the engine samples one more token. Prefill and decode
// differ only in how many tokens are pending.
type request struct {
	id        string
	seed      uint64               // KV hash seed (LoRA and cache salt: kvevents.SeedFor)
	lora      string               // LoRA adapter name (Request.LoRA), for emitters that publish it
	loraID    int                  // Request.LoRAID, for emitters that publish it
	salt      string               // Request.CacheSalt, for emitters that publish it
	media     []kvevents.MediaItem // Request.Media: mixed into the block hashes
	outSeed   uint64               // seed of the generated tokens
	vocab     []uint32             // generated tokens are drawn from it when set (Request.Vocab)
	tokens    []uint32
	promptLen int
	maxTokens int
	// transferred is Request.Transferred: leading prompt blocks whose KV
	// arrived by transfer (transfer.go).
	transferred int
	hashes      []kvevents.SeqHash // sequence hashes of the full blocks hashed so far
	blocks      []int32            // physical blocks held, in sequence order
	computed    int
	scheduled   int // tokens in the step in flight

	admitted     bool
	cachedTokens int // prompt tokens found in the cache at first admission
	preemptions  int
	generated    int

	arrival, firstAt, lastAt time.Time
	state                    reqState
	cancelled                bool
	stream                   *Stream
	stopAfter                func() bool
}

// decoding reports whether the request's pending work is one decode token.
func (r *request) decoding() bool {
	return r.generated > 0 && len(r.tokens)-r.computed == 1
}

// Stats are cumulative counters of one rank (since New, across restarts).
type Stats struct {
	Steps         uint64
	PrefillTokens uint64 // new prompt tokens computed
	DecodeTokens  uint64 // decode tokens computed
	OutputTokens  uint64 // tokens generated
	Completed     uint64 // requests finished with max_tokens reached
	Failed        uint64 // requests ended by cancel, restart or close
	Preemptions   uint64
	StoredBlocks  uint64
	RemovedBlocks uint64
	AdoptedBlocks uint64 // blocks found cached when they completed (computed twice)
	Clears        uint64
	EmitErrors    uint64
	LastEmitError error
	ModelTime     time.Duration // sum of step model times
	Stalls        uint64        // steps with work but nothing schedulable (a bug if ever > 0)
	LoRALoads     uint64        // adapters loaded onto the rank (Config.MaxLoRAs > 0)
	// TransferredBlocks counts prompt blocks taken from a KV transfer
	// instead of computed (Request.Transferred).
	TransferredBlocks uint64
}

// core is one rank: a KV cache, a scheduler and its step loop.
type core struct {
	cfg     *Config
	key     workerref.Target
	model   string
	salt    uint64
	wmark   int // watermark in blocks
	timing  Timing
	clock   Clock
	speedup float64

	wake chan struct{} // cap 1: work arrived

	mu      sync.Mutex
	cache   *kvCache
	waiting []*request
	running []*request
	byID    map[string]*request
	emitter EventEmitter
	gen     uint64
	closed  bool
	stats   Stats

	// step in flight
	plan    []*request
	planGen uint64
	// planned maps the hash of each full prompt block the planned step
	// computes, not yet cached, to its block. As vLLM v1 caches a block's
	// hash when it schedules the block (allocate_slots), a request admitted
	// later in the same step finds it as a prefix hit instead of computing
	// it again; the block becomes cached, and is published, when the step
	// completes (register).
	planned map[kvevents.SeqHash]int32

	// scratch
	evictBuf  []kvevents.SeqHash
	removeBuf []kvevents.EngineHash
	storeBuf  []kvevents.StoredBlock
	mediaBuf  []kvevents.MediaKey

	lora loraSlots // adapters resident on the rank (lora.go)
}

func newCore(cfg *Config, rank uint32, em EventEmitter) *core {
	c := &core{
		cfg:     cfg,
		key:     workerref.Target{Worker: cfg.Worker, Rank: rank},
		model:   cfg.Model,
		wmark:   int(cfg.Watermark * float64(cfg.KVBlocks)),
		timing:  cfg.Timing,
		clock:   rankClock(cfg.Clock, rank),
		speedup: cfg.Speedup,
		wake:    make(chan struct{}, 1),
		cache:   newKVCache(cfg.KVBlocks),
		byID:    make(map[string]*request),
		emitter: em,
	}
	c.salt = engineSalt(cfg.Worker, rank)
	return c
}

// rankClock gives ranks after the first their own VirtualClock, starting
// where the configured one is: ranks run in parallel, so their virtual
// times must not add up. Other clocks are shared.
func rankClock(c Clock, rank uint32) Clock {
	if vc, ok := c.(*VirtualClock); ok && rank > 0 {
		return NewVirtualClock(vc.Now())
	}
	return c
}

// engineSalt is xored into a sequence hash to make the engine's own block
// id: deterministic per (worker, rank), different across workers, and
// unique within the rank because a sequence hash is cached at most once.
func engineSalt(worker string, rank uint32) uint64 {
	return xxh3.HashStringSeed(worker, uint64(rank)+0x5eed)
}

// EngineHash returns the engine block id that worker's rank uses for the
// block with sequence hash h.
func EngineHash(worker string, rank uint32, h kvevents.SeqHash) kvevents.EngineHash {
	return kvevents.EngineHash(uint64(h) ^ engineSalt(worker, rank))
}

func (c *core) engineHash(h kvevents.SeqHash) kvevents.EngineHash {
	return kvevents.EngineHash(uint64(h) ^ c.salt)
}

func (c *core) blocksFor(tokens int) int {
	return (tokens + c.cfg.BlockSize - 1) / c.cfg.BlockSize
}

func (c *core) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *core) emit(ev kvevents.Event) {
	if err := c.emitter.Emit(ev); err != nil {
		c.stats.EmitErrors++
		c.stats.LastEmitError = err
	}
}

// StepEmitter is an EventEmitter that wants to know where engine steps
// end: EndStep is called (under the rank's lock) after every step that
// emitted events, and after Reset, Restart, Close and Reannounce, so that
// one step's events can travel as one batch, as vLLM publishes them.
type StepEmitter interface {
	EventEmitter
	EndStep() error
}

// TokenEmitter is an EventEmitter that also needs a Stored event's tokens
// (vLLM's BlockStored carries them): EmitStored gets them in place of Emit,
// len(blocks)·BlockSize tokens, and what else the blocks were hashed with
// (BlockKeys). It must not keep tokens after it returns. Reannounce skips a TokenEmitter: it has no
// tokens (the cache keeps hashes only), and a Cleared without the Stored
// events after it would empty its subscribers' view for nothing (vLLM
// never re-announces; its subscribers replay instead).
type TokenEmitter interface {
	EventEmitter
	EmitStored(ev kvevents.Event, tokens []uint32, keys BlockKeys) error
}

func (c *core) emitStored(ev kvevents.Event, tokens []uint32, keys BlockKeys) {
	te, ok := c.emitter.(TokenEmitter)
	if !ok {
		c.emit(ev)
		return
	}
	if err := te.EmitStored(ev, tokens, keys); err != nil {
		c.stats.EmitErrors++
		c.stats.LastEmitError = err
	}
}

// endStep tells a StepEmitter that the step's events are complete.
func (c *core) endStep() {
	if se, ok := c.emitter.(StepEmitter); ok {
		if err := se.EndStep(); err != nil {
			c.stats.EmitErrors++
			c.stats.LastEmitError = err
		}
	}
}

// ensureHashes extends r.hashes to cover the full blocks of r.tokens[:n].
func (c *core) ensureHashes(r *request, n int) {
	bs := c.cfg.BlockSize
	want := n / bs
	if len(r.hashes) >= want {
		return
	}
	if len(r.hashes) == 0 {
		r.hashes = kvevents.SeqHashesMedia(r.hashes, r.tokens[:want*bs], bs, r.seed, r.media)
		return
	}
	have := len(r.hashes)
	r.hashes = kvevents.SeqHashesFromMedia(r.hashes, r.hashes[have-1], r.tokens[have*bs:want*bs], have*bs, bs, r.seed, r.media)
}

// grow gives r n more blocks, evicting cached blocks if it must. The caller
// has checked availability.
func (c *core) grow(r *request, n int) {
	for ; n > 0; n-- {
		r.blocks = append(r.blocks, c.cache.allocate())
	}
}

// schedule plans one step, vLLM v1 style: running requests first (in
// admission order, preempting the newest when the cache is full), then, if
// nobody was preempted, waiting requests in arrival order while the token
// budget, the sequence limit and the cache allow. It emits the Removed event
// of blocks evicted for the step and returns the step's clock duration (model
// time divided by the speed-up). ok is false when there is no work.
func (c *core) schedule() (d time.Duration, gen uint64, ok bool) {
	c.purgeCancelled()
	c.plan = c.plan[:0]
	if len(c.running) == 0 && len(c.waiting) == 0 {
		return 0, c.gen, false
	}
	clear(c.planned)
	st := stepPlan{budget: c.cfg.MaxBatchedTokens}
	if preempted := c.planRunning(&st); !preempted {
		c.admitWaiting(&st)
	}
	c.flushRemoved()
	if len(c.plan) == 0 {
		c.stats.Stalls++
		return 0, c.gen, false
	}
	return c.stepTime(&st), c.gen, true
}

// stepPlan is what one step's plan has used so far.
type stepPlan struct {
	budget  int // tokens still schedulable (MaxBatchedTokens at the start)
	prefill int // prompt tokens planned
	decodes int // requests planned for one decode token
}

// addToPlan schedules n tokens of r in this step.
func (c *core) addToPlan(r *request, n int, st *stepPlan) {
	r.scheduled = n
	c.plan = append(c.plan, r)
	if r.decoding() {
		st.decodes++
	} else {
		st.prefill += n
		c.notePlanned(r, n)
	}
	st.budget -= n
}

// notePlanned records the full prompt blocks r computes in this step (the
// next n tokens) in c.planned.
func (c *core) notePlanned(r *request, n int) {
	bs := c.cfg.BlockSize
	from, to := r.computed/bs, min(r.computed+n, r.promptLen)/bs
	if from >= to {
		return
	}
	c.ensureHashes(r, to*bs)
	if c.planned == nil {
		c.planned = make(map[kvevents.SeqHash]int32)
	}
	for i := from; i < to; i++ {
		if _, cached := c.cache.lookup(r.hashes[i]); !cached {
			if _, dup := c.planned[r.hashes[i]]; !dup {
				c.planned[r.hashes[i]] = r.blocks[i]
			}
		}
	}
}

// hitBlock returns the block holding h for a prefix hit: a cached block,
// or one the planned step computes (see core.planned).
func (c *core) hitBlock(h kvevents.SeqHash) (b int32, planned, ok bool) {
	if b, ok := c.cache.lookup(h); ok {
		return b, false, true
	}
	b, ok = c.planned[h]
	return b, ok, ok
}

// planRunning plans the running requests in admission order, each as many
// tokens as it has left and the budget allows, preempting the newest while
// the cache cannot hold the blocks it needs. It reports whether it
// preempted any.
func (c *core) planRunning(st *stepPlan) (preempted bool) {
	for i := 0; i < len(c.running) && st.budget > 0; i++ {
		r := c.running[i]
		r.scheduled = 0
		n := min(len(r.tokens)-r.computed, st.budget)
		need := c.blocksFor(r.computed+n) - len(r.blocks)
		for need > c.cache.available() {
			victim := c.running[len(c.running)-1]
			c.preempt(victim)
			preempted = true
			if victim == r {
				break
			}
		}
		if r.state != stateRunning {
			break // r was the newest and preempted itself
		}
		c.grow(r, need)
		c.addToPlan(r, n, st)
	}
	return preempted
}

// admitWaiting admits waiting requests in arrival order while the budget,
// MaxSeqs and the cache (above the watermark) allow, each starting after
// its cached prefix. The head of the line waits for memory rather than
// being overtaken; a request whose adapter does not fit the step (MaxLoRAs)
// is skipped and keeps its place.
func (c *core) admitWaiting(st *stepPlan) {
	bs := c.cfg.BlockSize
	for i := 0; i < len(c.waiting) && st.budget > 0 && len(c.running) < c.cfg.MaxSeqs; {
		r := c.waiting[i]
		if !c.loraFits(r) {
			i++ // as vLLM: skipped, it keeps its place; later requests may run
			continue
		}
		hit, inLRU := c.prefixHits(r)
		start := c.transferStart(r, hit)
		computed := start * bs
		n := min(len(r.tokens)-computed, st.budget)
		need := c.blocksFor(computed+n) - hit
		if c.cache.available()-inLRU-need < c.wmark {
			return // head of line waits for memory
		}
		c.takeWaiting(i)
		c.admit(r, hit)
		c.grow(r, need)
		c.adoptTransferred(r, hit, start)
		r.state = stateRunning
		c.running = append(c.running, r)
		c.addToPlan(r, n, st)
	}
}

// prefixHits returns how many leading full blocks of r's prompt the cache
// holds (hit) and how many of those sit in the LRU, unreferenced (inLRU:
// admitting r takes them out of the evictable pool). As vLLM, the last
// token is always computed, to get its logits, so its block never counts
// as a hit.
func (c *core) prefixHits(r *request) (hit, inLRU int) {
	c.ensureHashes(r, len(r.tokens))
	maxHit := (len(r.tokens) - 1) / c.cfg.BlockSize
	for hit < maxHit {
		b, planned, found := c.hitBlock(r.hashes[hit])
		if !found {
			break
		}
		if !planned && c.cache.evictable(b) {
			inLRU++
		}
		hit++
	}
	return hit, inLRU
}

// admit takes the hit cached blocks of r's prefix and starts it after them;
// the first admission also records how much of the prompt was cached.
func (c *core) admit(r *request, hit int) {
	for k := 0; k < hit; k++ {
		b, _, _ := c.hitBlock(r.hashes[k])
		c.cache.acquire(b)
		r.blocks = append(r.blocks, b)
	}
	r.computed = hit * c.cfg.BlockSize
	if !r.admitted {
		r.admitted = true
		r.cachedTokens = min(r.computed, r.promptLen)
	}
}

// stepTime is the planned step's clock duration (its model time from the
// timing model, divided by the speed-up); it counts the step in the stats.
func (c *core) stepTime(st *stepPlan) time.Duration {
	p := float64(c.cache.active()) / float64(c.cache.total())
	ms := c.timing.StepMs(st.prefill, st.decodes, p)
	c.stats.Steps++
	c.stats.PrefillTokens += uint64(st.prefill)
	c.stats.DecodeTokens += uint64(st.decodes)
	model := msToDuration(ms) + c.loadAdapters()
	c.stats.ModelTime += model
	c.planGen = c.gen
	return time.Duration(float64(model) / c.speedup)
}

// flushRemoved emits one Removed event for the blocks evicted since the
// last call.
func (c *core) flushRemoved() {
	c.evictBuf = c.cache.takeEvicted(c.evictBuf)
	if len(c.evictBuf) == 0 {
		return
	}
	c.removeBuf = c.removeBuf[:0]
	for _, h := range c.evictBuf {
		c.removeBuf = append(c.removeBuf, c.engineHash(h))
	}
	c.stats.RemovedBlocks += uint64(len(c.removeBuf))
	for rest := c.removeBuf; len(rest) > 0; {
		n := min(len(rest), maxEventBlocks)
		c.emit(kvevents.Event{Kind: kvevents.KindRemoved, Tier: kvevents.TierDevice, Removed: rest[:n]})
		rest = rest[n:]
	}
}

// maxEventBlocks caps the blocks of one event, far below what one NATS
// message holds; longer runs are split (a Stored run's next part links to
// the previous part's last block).
const maxEventBlocks = 4096

// preempt sends the newest running request r back to the front of the
// queue, releasing its blocks (full ones stay cached, so the recompute hits
// them unless they are evicted meanwhile). r must be c.running's last.
func (c *core) preempt(r *request) {
	c.running = c.running[:len(c.running)-1]
	c.cache.releaseChain(r.blocks)
	r.blocks = r.blocks[:0]
	r.computed = 0
	r.scheduled = 0
	r.preemptions++
	r.state = stateWaiting
	c.waiting = slices.Insert(c.waiting, 0, r)
	c.stats.Preemptions++
}

// complete applies the step planned by schedule, now that its time has
// passed: tokens become computed, newly full blocks become cached (Stored),
// requests whose tokens are all computed sample one token, finished requests
// leave. A step planned before a restart is dropped.
func (c *core) complete(gen uint64) {
	if gen != c.gen || gen != c.planGen {
		c.plan = c.plan[:0]
		return
	}
	now := c.clock.Now()
	finished := false
	for _, r := range c.plan {
		if r.state != stateRunning {
			continue
		}
		old := r.computed
		r.computed += r.scheduled
		r.scheduled = 0
		c.register(r, old)
		if r.cancelled {
			c.finish(r, ErrCancelled, now)
			finished = true
			continue
		}
		if r.computed < len(r.tokens) {
			continue // prefill continues in a later chunk
		}
		tok := r.outputToken()
		r.tokens = append(r.tokens, tok)
		r.generated++
		c.stats.OutputTokens++
		if r.generated == 1 {
			r.firstAt = now
		}
		r.lastAt = now
		r.stream.push(tok, r.generated-1)
		if r.generated >= r.maxTokens {
			c.finish(r, nil, now)
			finished = true
		}
	}
	c.plan = c.plan[:0]
	if finished {
		c.running = slices.DeleteFunc(c.running, func(r *request) bool { return r.state == stateDone })
	}
}

// register caches the blocks of r that became full since old computed
// tokens and emits them as Stored events, one per run of consecutive new
// blocks, each linked to the block before it. A block whose hash is already
// cached (another request computed it meanwhile) is swapped for the cached
// one and its own memory freed.
func (c *core) register(r *request, old int) {
	bs := c.cfg.BlockSize
	from, to := old/bs, r.computed/bs
	if c.cfg.SkipOutputBlocks {
		to = min(to, r.promptLen/bs)
	}
	if from >= to {
		return
	}
	c.ensureHashes(r, to*bs)
	stored := c.storeBuf[:0]
	start := from
	flush := func() {
		if len(stored) == 0 {
			return
		}
		ev := kvevents.Event{Kind: kvevents.KindStored, Tier: kvevents.TierDevice, Blocks: stored}
		if start > 0 {
			ev.Parent, ev.HasParent = c.engineHash(r.hashes[start-1]), true
		}
		c.stats.StoredBlocks += uint64(len(stored))
		c.emitStoredMedia(ev, r, start)
		stored = stored[:0]
	}
	for i := from; i < to; i++ {
		h := r.hashes[i]
		if b, found := c.cache.lookup(h); found {
			flush()
			if b != r.blocks[i] {
				c.cache.acquire(b)
				c.cache.release(r.blocks[i])
				r.blocks[i] = b
				c.stats.AdoptedBlocks++
			}
			continue
		}
		if len(stored) == maxEventBlocks {
			flush()
		}
		if len(stored) == 0 {
			start = i
		}
		var parent kvevents.SeqHash
		if i > 0 {
			parent = r.hashes[i-1]
		}
		c.cache.register(r.blocks[i], h, parent, i)
		stored = append(stored, kvevents.StoredBlock{Engine: c.engineHash(h), Seq: h})
	}
	flush()
	c.storeBuf = stored
}

// finish ends r: releases its blocks and hands the result to its stream.
// The caller removes r from running/waiting.
func (c *core) finish(r *request, err error, now time.Time) {
	if r.state == stateDone {
		return
	}
	r.state = stateDone
	c.cache.releaseChain(r.blocks)
	r.blocks = nil
	delete(c.byID, r.id)
	if r.stopAfter != nil {
		r.stopAfter()
	}
	res := Result{
		RequestID:    r.id,
		Worker:       c.key.Worker,
		Rank:         c.key.Rank,
		PromptTokens: r.promptLen,
		CachedTokens: r.cachedTokens,
		OutputTokens: r.generated,
		Preemptions:  r.preemptions,
		E2E:          c.modelTime(now.Sub(r.arrival)),
		Err:          err,
		FinishReason: FinishLength,
	}
	if r.generated > 0 {
		res.TTFT = c.modelTime(r.firstAt.Sub(r.arrival))
	}
	if r.generated > 1 {
		res.ITL = c.modelTime(r.lastAt.Sub(r.firstAt)) / time.Duration(r.generated-1)
	}
	if err != nil {
		res.FinishReason = FinishError
		if err == ErrCancelled {
			res.FinishReason = FinishCancelled
		}
		c.stats.Failed++
	} else {
		c.stats.Completed++
	}
	r.stream.finish(res)
}

func (c *core) modelTime(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.speedup)
}

// purgeCancelled ends cancelled requests that are not in a step.
func (c *core) purgeCancelled() {
	now := time.Time{}
	drop := func(r *request) bool {
		if !r.cancelled {
			return false
		}
		if now.IsZero() {
			now = c.clock.Now()
		}
		c.finish(r, ErrCancelled, now)
		return true
	}
	c.waiting = slices.DeleteFunc(c.waiting, drop)
	c.running = slices.DeleteFunc(c.running, drop)
}

// cancel marks r cancelled; the step loop ends it.
func (c *core) cancel(r *request) {
	c.mu.Lock()
	if r.state != stateDone {
		r.cancelled = true
	}
	c.mu.Unlock()
	c.signal()
}

// failAll ends every request with err.
func (c *core) failAll(err error) {
	now := c.clock.Now()
	for _, r := range c.running {
		c.finish(r, err, now)
	}
	for _, r := range c.waiting {
		c.finish(r, err, now)
	}
	c.running = c.running[:0]
	c.waiting = c.waiting[:0]
	c.plan = c.plan[:0]
}

// clear empties the cache (no Removed events: the caller emits Cleared).
func (c *core) clear() {
	c.cache = newKVCache(c.cfg.KVBlocks)
	c.gen++
	c.stats.Clears++
	c.emit(kvevents.Event{Kind: kvevents.KindCleared, Tier: kvevents.TierDevice})
	c.endStep()
}

// busy reports whether the rank holds requests.
func (c *core) busy() bool { return len(c.running) > 0 || len(c.waiting) > 0 }

// stepOnce runs one step to completion on the clock. It returns false when
// there was nothing to do.
// The step's events (evictions while scheduling, stores on completion) end
// with endStep, as vLLM publishes one batch per scheduler step.
func (c *core) stepOnce(ctx context.Context) (bool, error) {
	c.mu.Lock()
	d, gen, ok := c.schedule()
	if !ok {
		c.endStep()
	}
	c.mu.Unlock()
	if !ok {
		return false, nil
	}
	if err := c.clock.Sleep(ctx, d); err != nil {
		c.mu.Lock()
		c.endStep()
		c.mu.Unlock()
		return true, err
	}
	c.mu.Lock()
	c.complete(gen)
	c.endStep()
	c.mu.Unlock()
	return true, nil
}

// loop runs steps until ctx ends, waiting for work when idle.
func (c *core) loop(ctx context.Context) {
	for {
		did, err := c.stepOnce(ctx)
		if err != nil {
			return
		}
		if did {
			continue
		}
		select {
		case <-c.wake:
		case <-ctx.Done():
			return
		}
	}
}

// reannounce emits Cleared and then Stored events for every cached block,
// parents first, in runs along chains.
func (c *core) reannounce() {
	if _, ok := c.emitter.(TokenEmitter); ok {
		return
	}
	c.emit(kvevents.Event{Kind: kvevents.KindCleared, Tier: kvevents.TierDevice})
	children := make(map[kvevents.SeqHash][]kvevents.SeqHash)
	var roots []kvevents.SeqHash
	for h, b := range c.cache.byHash {
		blk := &c.cache.blocks[b]
		if blk.depth == 0 {
			roots = append(roots, h)
		} else {
			children[blk.parent] = append(children[blk.parent], h)
		}
	}
	slices.Sort(roots)
	type start struct {
		h         kvevents.SeqHash
		parent    kvevents.SeqHash
		hasParent bool
	}
	stack := make([]start, 0, len(roots))
	for i := len(roots) - 1; i >= 0; i-- {
		stack = append(stack, start{h: roots[i]})
	}
	run := c.storeBuf[:0]
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		run = run[:0]
		for h := s.h; ; {
			run = append(run, kvevents.StoredBlock{Engine: c.engineHash(h), Seq: h})
			kids := children[h]
			if len(kids) == 0 || len(run) == maxEventBlocks {
				for _, k := range kids {
					stack = append(stack, start{h: k, parent: h, hasParent: true})
				}
				break
			}
			slices.Sort(kids)
			for _, k := range kids[1:] {
				stack = append(stack, start{h: k, parent: h, hasParent: true})
			}
			h = kids[0]
		}
		ev := kvevents.Event{Kind: kvevents.KindStored, Tier: kvevents.TierDevice, Blocks: run}
		if s.hasParent {
			ev.Parent, ev.HasParent = c.engineHash(s.parent), true
		}
		c.stats.StoredBlocks += uint64(len(run))
		c.emit(ev)
	}
	c.storeBuf = run
	c.endStep()
}

// advanceTo steps while the rank has work and its clock is before t, then
// moves an idle rank's virtual clock to t.
func (c *core) advanceTo(ctx context.Context, vc *VirtualClock, t time.Time) error {
	for vc.Now().Before(t) {
		did, err := c.stepOnce(ctx)
		if err != nil {
			return err
		}
		if !did {
			vc.Advance(t.Sub(vc.Now()))
			return nil
		}
	}
	return nil
}
