package index

import (
	"sync"
	"sync/atomic"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// Config sets up an Index. The zero value is usable.
type Config struct {
	// Model is the model this index serves. When set, batches for other
	// models are ignored (counted in Stats.ForeignModel); snapshots are
	// stored under its name and need it.
	Model string

	// Tier is the storage tier that feeds the index; Stored and Removed
	// events of other tiers are counted in Stats.IgnoredTier and otherwise
	// ignored (Cleared has no tier on the wire and empties the rank). The zero
	// value is kvevents.TierDevice. Scoring host memory too means a second
	// Index with Tier: kvevents.TierHost, combined by the caller.
	Tier kvevents.Tier

	// Shards is the number of block-table shards, rounded up to a power of
	// two (default 256). More shards mean shorter writer critical sections
	// and smaller resize pauses; readers never lock either way.
	Shards int

	// MaxEntries caps the number of (block, worker) entries in the index
	// (0 = no cap). When the cap is reached, new stores are refused and
	// counted in Stats.RefusedStores, while removals, clears and lookups go
	// on normally. A refused block is simply not indexed: the index may
	// under-report a worker's cache, never over-report it. The cap is
	// exact: writes are serialised.
	MaxEntries int64

	// MaxEntriesPerWorker caps one (worker, rank)'s entries the same way
	// (0 = no cap), so one runaway publisher cannot take the whole budget.
	// SetWorkerLimit lowers it for one worker (to what it can hold).
	MaxEntriesPerWorker int
}

// Index is the prefix index of one model: for every (worker, rank), the
// blocks (sequence hashes) its cache holds. Lookups may run on any number
// of goroutines at once and in parallel with event application, and take
// no lock. Writes (batches, resyncs, worker removal, loads) are serialised
// by one mutex taken once per call, so a batch is applied as a unit and
// the writes of one (worker, rank) stay in call order. The index is fed by
// one subscriber goroutine, so a single writer lock costs nothing in
// contention and saves a lock per block; see doc.go.
type Index struct {
	cfg       Config
	shardBits uint
	shards    []shard

	wmu      sync.Mutex // serialises every write, guards workers and writer-only fields
	workers  map[workerref.Target]*worker
	limits   map[string]int // SetWorkerLimit's caps, by worker
	free     []uint32       // FIFO of freed slots, oldest first
	nextSlot uint32
	slots    atomic.Pointer[slotTable]
	// infoChunk is the unused rest of the block slot owners are taken from.
	infoChunk []slotInfo
	// slotEpoch counts slot assignments. A lookup ignores slots assigned
	// after it started, so a reused slot never lends its new owner the
	// blocks a concurrent lookup saw for the old one.
	slotEpoch atomic.Uint64

	entries   atomic.Int64
	streamSeq atomic.Uint64
	ctr       counters
	// engineKeyed counts the workers that are not sequence-keyed (a new
	// worker is, until its first batch says otherwise); while it is 0 the
	// block tables keep more headroom (capFor).
	engineKeyed int
}

type slotInfo struct {
	key        workerref.Target
	assignedAt uint64
}

type slotTable struct {
	p []atomic.Pointer[slotInfo]
}

// worker is the per-(worker, rank) state the write path needs: the engine
// hash → sequence hash map used to resolve removals, for an engine-keyed
// worker. Guarded by Index.wmu.
type worker struct {
	key  workerref.Target
	slot uint32
	// seqKeyed: its batches name blocks by sequence hash
	// (kvevents.Batch.SeqKeyed; seqkeyed.go), and engines stays empty.
	seqKeyed bool

	engines engMap // engine hash -> sequence hash
	// multi counts extra engine hashes mapping to a sequence hash the
	// worker already holds (rare: only engines whose block ids are not a
	// function of content). The block leaves the index with the last one.
	multi   map[kvevents.SeqHash]uint32
	entries int // distinct sequence hashes indexed for this worker
	limit   int // cap on entries (0 = none): Config.MaxEntriesPerWorker or SetWorkerLimit's

	cursor kvevents.Cursor // position after the last batch applied

	sink uint64 // folds pre-touched words so the loads stay
}

type counters struct {
	batches, events, stored, dupStores, removed, unknownRemovals, cleared, orphanStores,
	rebound, ignoredTier, refused, foreignModel, badEvents, badBatches, resyncs,
	workersRemoved, rekeyed atomic.Uint64
}

// New returns an empty index.
func New(cfg Config) *Index {
	n := 256
	if cfg.Shards > 0 {
		n = 1
		for n < cfg.Shards && n < 1<<16 {
			n <<= 1
		}
	}
	bits := uint(0)
	for 1<<bits < n {
		bits++
	}
	cfg.Shards = n
	x := &Index{
		cfg:       cfg,
		shardBits: bits,
		shards:    make([]shard, n),
		workers:   make(map[workerref.Target]*worker),
	}
	for i := range x.shards {
		x.shards[i].init()
		x.shards[i].roomy = true // no worker yet: none is engine-keyed
	}
	x.slots.Store(&slotTable{})
	return x
}

// Config returns the configuration the index runs with (defaults filled).
func (x *Index) Config() Config { return x.cfg }

func (x *Index) shardOf(h uint64) *shard {
	if x.shardBits == 0 {
		return &x.shards[0]
	}
	return &x.shards[h>>(64-x.shardBits)]
}

// removeEntry takes slot out of seq's set (wmu held).
func (x *Index) removeEntry(seq kvevents.SeqHash, slot uint32) bool {
	h := mix(uint64(seq))
	return x.shardOf(h).remove(uint64(seq), h, slot)
}

// slot table -------------------------------------------------------------------

func (x *Index) info(slot uint32) *slotInfo {
	t := x.slots.Load()
	if int(slot) < len(t.p) {
		return t.p[slot].Load()
	}
	return nil
}

// allocSlot gives k a slot; x.wmu is held.
func (x *Index) allocSlot(k workerref.Target) (uint32, bool) {
	var s uint32
	switch {
	case len(x.free) > 0:
		s = x.free[0]
		x.free = x.free[1:]
	case int(x.nextSlot) < MaxSlots:
		s = x.nextSlot
		x.nextSlot++
	default:
		return 0, false
	}
	t := x.slots.Load()
	if int(s) >= len(t.p) {
		nt := &slotTable{p: make([]atomic.Pointer[slotInfo], max(2*len(t.p), int(s)+1, 64))}
		for i := range t.p {
			nt.p[i].Store(t.p[i].Load())
		}
		x.slots.Store(nt)
		t = nt
	}
	if len(x.infoChunk) == 0 {
		x.infoChunk = make([]slotInfo, infoChunkLen)
	}
	info := &x.infoChunk[0]
	x.infoChunk = x.infoChunk[1:]
	*info = slotInfo{key: k, assignedAt: x.slotEpoch.Add(1)}
	t.p[s].Store(info)
	return s, true
}

// infoChunkLen is how many slot owners are allocated together. A lookup
// that matches a thousand workers reads a thousand owners; allocated side
// by side in slot order they stream through the cache (BenchmarkLookup,
// shared1000) instead of being a thousand scattered loads. An owner is
// written once, before it is published, and never again.
const infoChunkLen = 64

// worker returns k's state, creating it when create is set. It returns
// nil when k is unknown (and !create) or when every slot is taken. wmu is
// held.
func (x *Index) worker(k workerref.Target, create bool) *worker {
	w := x.workers[k]
	if w != nil || !create {
		return w
	}
	slot, ok := x.allocSlot(k)
	if !ok {
		return nil
	}
	w = &worker{key: k, slot: slot, limit: x.limitOf(k.Worker)}
	x.workers[k] = w
	x.countKeying(1)
	return w
}

// limitOf is the entry cap of each rank of worker: the lower of
// Config.MaxEntriesPerWorker and SetWorkerLimit's (0 = none). wmu is held.
func (x *Index) limitOf(worker string) int {
	n := x.cfg.MaxEntriesPerWorker
	if l, ok := x.limits[worker]; ok && (n == 0 || l < n) {
		n = l
	}
	return n
}

// SetWorkerLimit caps the entries of each rank of worker at n, below
// Config.MaxEntriesPerWorker when that is lower (n <= 0 removes the
// worker's own cap). A replica sets it from what the worker says it can
// hold, so a worker that floods stored blocks stops at its own size. Blocks
// already indexed stay; new stores past the cap are refused and counted.
// RemoveWorker forgets it.
func (x *Index) SetWorkerLimit(worker string, n int) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	if n <= 0 {
		delete(x.limits, worker)
	} else {
		if x.limits == nil {
			x.limits = make(map[string]int)
		}
		x.limits[worker] = n
	}
	l := x.limitOf(worker)
	for k, w := range x.workers {
		if k.Worker == worker {
			w.limit = l
		}
	}
}

// write path -------------------------------------------------------------------

type batchCounts struct {
	events, stored, dup, removed, unknown, cleared, orphan, rebound, tier, refused, bad uint64
	delta                                                                               int64
}

func (x *Index) flush(c *batchCounts) {
	add := func(a *atomic.Uint64, v uint64) {
		if v != 0 {
			a.Add(v)
		}
	}
	add(&x.ctr.events, c.events)
	add(&x.ctr.stored, c.stored)
	add(&x.ctr.dupStores, c.dup)
	add(&x.ctr.removed, c.removed)
	add(&x.ctr.unknownRemovals, c.unknown)
	add(&x.ctr.cleared, c.cleared)
	add(&x.ctr.orphanStores, c.orphan)
	add(&x.ctr.rebound, c.rebound)
	add(&x.ctr.ignoredTier, c.tier)
	add(&x.ctr.refused, c.refused)
	add(&x.ctr.badEvents, c.bad)
	if c.delta != 0 {
		x.entries.Add(c.delta)
	}
}

// ApplyBatch applies one batch of one (worker, rank) and records streamSeq
// as applied (kvevents.Sink). The batch is not retained. Re-applying events
// the index already reflects is harmless: a duplicate store or a removal
// of an unknown block is counted and changes nothing, so replaying a stream
// from an older sequence converges to the same state.
func (x *Index) ApplyBatch(streamSeq uint64, b *kvevents.Batch) {
	defer x.noteSeq(streamSeq)
	if b == nil || b.Worker == "" {
		x.ctr.badBatches.Add(1)
		return
	}
	if x.cfg.Model != "" && b.Model != x.cfg.Model {
		x.ctr.foreignModel.Add(1)
		return
	}
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.ctr.batches.Add(1)
	w := x.worker(b.Key(), true)
	if w == nil {
		n := 0
		for i := range b.Events {
			n += len(b.Events[i].Blocks)
		}
		x.ctr.refused.Add(uint64(n))
		return
	}
	var c batchCounts
	x.setKeying(w, b.SeqKeyed, &c)
	for i := range b.Events {
		x.applyEvent(w, &b.Events[i], &c)
	}
	if b.FirstEventID != 0 {
		// Recorded, not acted on: ordering, gaps and epochs are the
		// subscriber's job. Snapshots carry it so that a restored index
		// can tell the subscriber where each worker stands.
		w.cursor = kvevents.Cursor{Epoch: b.Epoch, NextID: b.NextEventID()}
	}
	x.flush(&c)
}

func (x *Index) noteSeq(s uint64) {
	for {
		cur := x.streamSeq.Load()
		if s <= cur || x.streamSeq.CompareAndSwap(cur, s) {
			return
		}
	}
}

// StreamSeq returns the highest stream sequence handed to ApplyBatch (or
// restored from a snapshot). When batches arrive in stream order, every
// event at or below it is reflected in the index.
func (x *Index) StreamSeq() uint64 { return x.streamSeq.Load() }

func (x *Index) applyEvent(w *worker, ev *kvevents.Event, c *batchCounts) {
	c.events++
	switch ev.Kind {
	case kvevents.KindStored:
		if ev.Tier != x.cfg.Tier {
			c.tier++
			return
		}
		if w.seqKeyed {
			inChunks(ev.Blocks, func(b []kvevents.StoredBlock) { x.seqStoreChunk(w, b, c) })
			return
		}
		if ev.HasParent {
			if _, ok := w.engines.get(uint64(ev.Parent)); !ok {
				// The blocks are still indexed: their sequence hashes
				// carry the prefix, and a lookup cannot match through
				// the missing parent anyway.
				c.orphan++
			}
		}
		inChunks(ev.Blocks, func(b []kvevents.StoredBlock) { x.storeChunk(w, b, c) })
	case kvevents.KindRemoved:
		if ev.Tier != x.cfg.Tier {
			c.tier++
			return
		}
		if w.seqKeyed {
			inChunks(ev.RemovedSeqs, func(s []kvevents.SeqHash) { x.seqRemoveChunk(w, s, c) })
			return
		}
		inChunks(ev.Removed, func(e []kvevents.EngineHash) { x.removeChunk(w, e, c) })
	case kvevents.KindCleared:
		// Cleared means every block of the rank left the cache, all tiers
		// (the event wire format carries no tier for it), so it applies
		// whatever Tier says.
		x.clearLocked(w, c)
		c.cleared++
	default:
		c.bad++
	}
}

// touchChunk is how many blocks of an event are pre-touched at once.
const touchChunk = 32

// inChunks calls fn on s in pieces of at most touchChunk.
func inChunks[T any](s []T, fn func([]T)) {
	for len(s) > 0 {
		n := min(len(s), touchChunk)
		fn(s[:n])
		s = s[n:]
	}
}

// storeChunk stores up to touchChunk blocks. It first loads the
// engine-map and block-table buckets of every block: those loads do not
// depend on each other, so the CPU overlaps their cache misses, and the
// writes that follow hit the cache. With an index larger than the cache
// this is most of the cost of a stored block.
func (x *Index) storeChunk(w *worker, blks []kvevents.StoredBlock, c *batchCounts) {
	var eh, sh [touchChunk]uint64
	var sink uint64
	for i := range blks {
		eh[i] = mix(uint64(blks[i].Engine))
		sink += w.engines.touch(eh[i])
		sh[i] = mix(uint64(blks[i].Seq))
		sink += x.shardOf(sh[i]).touch(sh[i])
	}
	w.sink += sink
	for i := range blks {
		x.store(w, blks[i], eh[i], sh[i], c)
	}
}

// removeChunk removes up to touchChunk engine hashes: touch their
// engine-map buckets, resolve them, touch the block buckets, then drop the
// blocks. The block touches get a loop of their own: interleaved with the
// resolving (a probe and a backward-shift deletion each), few of them fit
// in the CPU's window at once and their misses queued (BenchmarkApply,
// entries=1M).
func (x *Index) removeChunk(w *worker, rm []kvevents.EngineHash, c *batchCounts) {
	var seqs, sh [touchChunk]uint64
	var sink uint64
	for i, e := range rm {
		sh[i] = mix(uint64(e))
		sink += w.engines.touch(sh[i])
	}
	n := 0
	for i, e := range rm {
		s, ok := w.engines.delH(uint64(e), sh[i])
		if !ok {
			c.unknown++
			continue
		}
		seqs[n] = s
		n++
	}
	c.removed += uint64(n)
	for i := 0; i < n; i++ {
		sh[i] = mix(seqs[i])
		sink += x.shardOf(sh[i]).touch(sh[i])
	}
	for i := 0; i < n; i++ {
		x.dropRef(w, kvevents.SeqHash(seqs[i]), sh[i], c)
	}
	w.sink += sink
}

// store adds one block for w; eh and h are the mixed engine and sequence
// hashes.
func (x *Index) store(w *worker, blk kvevents.StoredBlock, eh, h uint64, c *batchCounts) {
	e, seq := uint64(blk.Engine), uint64(blk.Seq)
	var at uint64
	if e == 0 {
		// Key 0 lives outside the table: take the general path.
		if old, ok := w.engines.get(0); ok {
			if old == seq {
				c.dup++
				return
			}
			w.engines.del(0)
			x.dropRef(w, kvevents.SeqHash(old), mix(old), c)
			c.rebound++
		}
	} else {
		i, found := w.engines.find(e, eh)
		if found {
			old := w.engines.s[2*i+1]
			if old == seq {
				c.dup++
				return
			}
			// The engine reused a block id for other content: the old
			// mapping is gone.
			w.engines.delH(e, eh)
			x.dropRef(w, kvevents.SeqHash(old), mix(old), c)
			c.rebound++
			i, _ = w.engines.find(e, eh)
		}
		at = i
	}
	if (x.cfg.MaxEntries > 0 && x.entries.Load()+c.delta >= x.cfg.MaxEntries) ||
		(w.limit > 0 && w.entries >= w.limit) {
		c.refused++
		return
	}
	if e == 0 {
		w.engines.put(0, seq)
	} else {
		w.engines.insertAt(at, e, seq)
	}
	if x.shardOf(h).add(seq, h, w.slot) {
		w.entries++
		c.delta++
	} else {
		if w.multi == nil {
			w.multi = make(map[kvevents.SeqHash]uint32)
		}
		w.multi[blk.Seq]++
	}
	c.stored++
}

// dropRef releases one engine-hash reference to seq (h = mix(seq)).
func (x *Index) dropRef(w *worker, seq kvevents.SeqHash, h uint64, c *batchCounts) {
	if w.multi != nil {
		if n, ok := w.multi[seq]; ok {
			if n <= 1 {
				delete(w.multi, seq)
			} else {
				w.multi[seq] = n - 1
			}
			return
		}
	}
	if x.shardOf(h).remove(uint64(seq), h, w.slot) {
		w.entries--
		c.delta--
	}
}

func (x *Index) clearLocked(w *worker, c *batchCounts) {
	if w.seqKeyed {
		x.clearSeqKeyed(w, c)
		return
	}
	if w.engines.len() == 0 {
		return
	}
	w.multi = nil
	w.engines.each(func(_, s uint64) {
		if x.removeEntry(kvevents.SeqHash(s), w.slot) {
			w.entries--
			c.delta--
		}
	})
	w.engines = engMap{ident: w.engines.ident}
}

// ClearWorker drops every block held for k (an engine restart, a gap, an
// operator action). The worker keeps its slot and its cursor.
func (x *Index) ClearWorker(k workerref.Target) { x.clearWorker(k, false) }

// resync is what a gap or epoch signal does: clear the worker and forget
// its cursor; the batch that triggered it follows through ApplyBatch.
func (x *Index) resync(k workerref.Target) {
	x.ctr.resyncs.Add(1)
	x.clearWorker(k, true)
}

// clearWorker drops k's blocks under the write lock, and its cursor too
// when forgetCursor is set.
func (x *Index) clearWorker(k workerref.Target, forgetCursor bool) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	w := x.worker(k, false)
	if w == nil {
		return
	}
	var c batchCounts
	x.clearLocked(w, &c)
	if forgetCursor {
		w.cursor = kvevents.Cursor{}
	}
	x.flush(&c)
}

// RemoveWorker forgets every rank of the worker name (it left the fleet): their
// blocks leave the index, their slots become reusable and the worker's
// SetWorkerLimit is forgotten.
func (x *Index) RemoveWorker(name string) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	delete(x.limits, name)
	var ranks []*worker
	for k, w := range x.workers {
		if k.Worker == name {
			ranks = append(ranks, w)
		}
	}
	var c batchCounts
	x.clearSeqKeyedAll(ranks, &c) // one table walk for all its sequence-keyed ranks
	x.flush(&c)
	for _, w := range ranks {
		x.removeKey(w.key)
	}
}

// RemoveKey forgets one (worker, rank).
func (x *Index) RemoveKey(k workerref.Target) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.removeKey(k)
}

func (x *Index) removeKey(k workerref.Target) {
	w := x.worker(k, false)
	if w == nil {
		return
	}
	var c batchCounts
	x.clearLocked(w, &c)
	delete(x.workers, k)
	if !w.seqKeyed {
		x.countKeying(-1)
	}
	// Every entry of the slot is gone, so it can be handed out again.
	x.free = append(x.free, w.slot)
	x.flush(&c)
	x.ctr.workersRemoved.Add(1)
}

// LoadWorker replaces everything held for k with blocks, for example a
// dump fetched from the worker after a resync. It is one ordered write of
// k: concurrent lookups may see the old blocks, none, or the new ones.
// The blocks are engine-keyed (each names its engine hash); the worker's
// later batches may be of either keying.
func (x *Index) LoadWorker(k workerref.Target, blocks []kvevents.StoredBlock) {
	x.loadWorker(k, kvevents.Cursor{}, blocks, false)
}

// loadWorker replaces k's blocks; seqKeyed says blocks name sequence
// hashes only (a snapshot of a sequence-keyed worker).
func (x *Index) loadWorker(k workerref.Target, cur kvevents.Cursor, blocks []kvevents.StoredBlock, seqKeyed bool) bool {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	w := x.worker(k, true)
	if w == nil {
		x.ctr.refused.Add(uint64(len(blocks)))
		return false
	}
	var c batchCounts
	x.clearLocked(w, &c)
	x.setSeqKeyed(w, seqKeyed)
	if len(blocks) > 0 && !seqKeyed {
		w.engines.init(len(blocks))
	}
	if seqKeyed {
		inChunks(blocks, func(b []kvevents.StoredBlock) { x.seqStoreChunk(w, b, &c) })
	} else {
		inChunks(blocks, func(b []kvevents.StoredBlock) { x.storeChunk(w, b, &c) })
	}
	w.cursor = cur
	x.flush(&c)
	return true
}

// Workers returns the (worker, rank) keys the index knows, in no order.
func (x *Index) Workers() []workerref.Target {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	out := make([]workerref.Target, 0, len(x.workers))
	for k := range x.workers {
		out = append(out, k)
	}
	return out
}
