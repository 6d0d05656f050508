package index

import (
	"sync"
	"sync/atomic"

	"github.com/kvrouter/kvrouter/kvevents"
)

// Config sets up an Index. The zero value is usable.
type Config struct {
	// Model is the model this index serves. When set, batches for other
	// models are ignored (counted in Stats.ForeignModel); snapshots are
	// stored under its name and need it.
	Model string

	// Tier is the storage tier that feeds the index; events of other tiers
	// are counted in Stats.IgnoredTier and otherwise ignored. The zero
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
	// under-report a worker's cache, never over-report it. With several
	// goroutines applying batches at once the cap may be overshot by at
	// most one batch per goroutine.
	MaxEntries int64

	// MaxEntriesPerWorker caps one (worker, rank)'s entries the same way
	// (0 = no cap), so one runaway publisher cannot take the whole budget.
	MaxEntriesPerWorker int
}

// Index is the prefix index of one model: for every (worker, rank), the
// blocks (sequence hashes) its cache holds. Lookups may run on any number
// of goroutines at once and in parallel with event application; writes of
// one (worker, rank) are applied in call order.
type Index struct {
	cfg       Config
	shardBits uint
	shards    []shard

	wmu      sync.RWMutex
	workers  map[kvevents.WorkerKey]*worker
	free     []uint32 // FIFO of freed slots, oldest first
	nextSlot uint32
	slots    atomic.Pointer[slotTable]
	// slotEpoch counts slot assignments. A lookup ignores slots assigned
	// after it started, so a reused slot never lends its new owner the
	// blocks a concurrent lookup saw for the old one.
	slotEpoch atomic.Uint64

	entries   atomic.Int64
	streamSeq atomic.Uint64
	ctr       counters
}

type slotInfo struct {
	key        kvevents.WorkerKey
	assignedAt uint64
}

type slotTable struct {
	p []atomic.Pointer[slotInfo]
}

// worker is the per-(worker, rank) state the write path needs: the engine
// hash → sequence hash map used to resolve removals. mu orders the
// worker's writes.
type worker struct {
	mu      sync.Mutex
	key     kvevents.WorkerKey
	slot    uint32
	removed bool

	engines engMap // engine hash -> sequence hash
	// multi counts extra engine hashes mapping to a sequence hash the
	// worker already holds (rare: only engines whose block ids are not a
	// function of content). The block leaves the index with the last one.
	multi   map[kvevents.SeqHash]uint32
	entries int // distinct sequence hashes indexed for this worker

	cursor kvevents.Cursor // position after the last batch applied

	seqBuf []kvevents.SeqHash // scratch for removals
	sink   uint64             // folds pre-touched words so the loads stay
}

type counters struct {
	batches, events, stored, dupStores, removed, unknownRemovals, cleared, orphanStores,
	rebound, ignoredTier, refused, foreignModel, badEvents, badBatches, resyncs,
	workersRemoved atomic.Uint64
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
		workers:   make(map[kvevents.WorkerKey]*worker),
	}
	for i := range x.shards {
		x.shards[i].init()
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

// addEntry records that slot holds seq; false if it already did.
func (x *Index) addEntry(seq kvevents.SeqHash, slot uint32) bool {
	h := mix(uint64(seq))
	sh := x.shardOf(h)
	sh.mu.Lock()
	ok := sh.add(uint64(seq), h, slot)
	sh.mu.Unlock()
	return ok
}

func (x *Index) removeEntry(seq kvevents.SeqHash, slot uint32) bool {
	h := mix(uint64(seq))
	sh := x.shardOf(h)
	sh.mu.Lock()
	ok := sh.remove(uint64(seq), h, slot)
	sh.mu.Unlock()
	return ok
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
func (x *Index) allocSlot(k kvevents.WorkerKey) (uint32, bool) {
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
	t.p[s].Store(&slotInfo{key: k, assignedAt: x.slotEpoch.Add(1)})
	return s, true
}

// lockWorker returns k's state with its mutex held, creating it when
// create is set. It returns nil when k is unknown (and !create) or when
// every slot is taken.
func (x *Index) lockWorker(k kvevents.WorkerKey, create bool) *worker {
	for {
		x.wmu.RLock()
		w := x.workers[k]
		x.wmu.RUnlock()
		if w == nil {
			if !create {
				return nil
			}
			x.wmu.Lock()
			if w = x.workers[k]; w == nil {
				slot, ok := x.allocSlot(k)
				if !ok {
					x.wmu.Unlock()
					return nil
				}
				w = &worker{key: k, slot: slot}
				x.workers[k] = w
			}
			x.wmu.Unlock()
		}
		w.mu.Lock()
		if !w.removed {
			return w
		}
		// Removed between the map read and the lock: look again.
		w.mu.Unlock()
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
	x.ctr.batches.Add(1)
	w := x.lockWorker(b.Key(), true)
	if w == nil {
		x.ctr.refused.Add(uint64(len(b.Events)))
		return
	}
	var c batchCounts
	for i := range b.Events {
		x.applyEvent(w, &b.Events[i], &c)
	}
	if b.FirstEventID != 0 {
		// Recorded, not acted on: ordering, gaps and epochs are the
		// subscriber's job. Snapshots carry it so that a restored index
		// can tell the subscriber where each worker stands.
		w.cursor = kvevents.Cursor{Epoch: b.Epoch, NextID: b.NextEventID()}
	}
	w.mu.Unlock()
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
		if ev.HasParent {
			if _, ok := w.engines.get(uint64(ev.Parent)); !ok {
				// The blocks are still indexed: their sequence hashes
				// carry the prefix, and a lookup cannot match through
				// the missing parent anyway.
				c.orphan++
			}
		}
		for blks := ev.Blocks; len(blks) > 0; {
			n := min(len(blks), touchChunk)
			x.touchStores(w, blks[:n])
			for _, blk := range blks[:n] {
				x.storeLocked(w, blk, c)
			}
			blks = blks[n:]
		}
	case kvevents.KindRemoved:
		if ev.Tier != x.cfg.Tier {
			c.tier++
			return
		}
		for rm := ev.Removed; len(rm) > 0; {
			n := min(len(rm), touchChunk)
			x.removeEngines(w, rm[:n], c)
			rm = rm[n:]
		}
	case kvevents.KindCleared:
		// A clear empties the rank whatever the tier named: engines send
		// it with the default tier.
		x.clearLocked(w, c)
		c.cleared++
	default:
		c.bad++
	}
}

// touchChunk is how many blocks of an event are pre-touched at once.
const touchChunk = 32

// touchStores loads the engine-map and block-table buckets of blks before
// they are written. The loads do not depend on each other, so the CPU
// overlaps their cache misses; the writes that follow then hit the cache.
// With a large index this halves the cost of a stored block.
func (x *Index) touchStores(w *worker, blks []kvevents.StoredBlock) {
	var sink uint64
	for i := range blks {
		sink += w.engines.touch(uint64(blks[i].Engine))
		h := mix(uint64(blks[i].Seq))
		sink += x.shardOf(h).touch(h)
	}
	w.sink += sink
}

// removeEngines removes a chunk of engine hashes: touch their engine-map
// buckets, resolve them (touching the block buckets), then drop the blocks.
func (x *Index) removeEngines(w *worker, rm []kvevents.EngineHash, c *batchCounts) {
	var sink uint64
	for _, e := range rm {
		sink += w.engines.touch(uint64(e))
	}
	w.seqBuf = w.seqBuf[:0]
	for _, e := range rm {
		s, ok := w.engines.del(uint64(e))
		if !ok {
			c.unknown++
			continue
		}
		w.seqBuf = append(w.seqBuf, kvevents.SeqHash(s))
		h := mix(s)
		sink += x.shardOf(h).touch(h)
		c.removed++
	}
	for _, s := range w.seqBuf {
		x.dropRef(w, s, c)
	}
	w.sink += sink
}

func (x *Index) storeLocked(w *worker, blk kvevents.StoredBlock, c *batchCounts) {
	if old, ok := w.engines.get(uint64(blk.Engine)); ok {
		if kvevents.SeqHash(old) == blk.Seq {
			c.dup++
			return
		}
		// The engine reused a block id for other content: the old
		// mapping is gone.
		w.engines.del(uint64(blk.Engine))
		x.dropRef(w, kvevents.SeqHash(old), c)
		c.rebound++
	}
	if (x.cfg.MaxEntries > 0 && x.entries.Load()+c.delta >= x.cfg.MaxEntries) ||
		(x.cfg.MaxEntriesPerWorker > 0 && w.entries >= x.cfg.MaxEntriesPerWorker) {
		c.refused++
		return
	}
	w.engines.put(uint64(blk.Engine), uint64(blk.Seq))
	if x.addEntry(blk.Seq, w.slot) {
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

// dropRef releases one engine-hash reference to seq.
func (x *Index) dropRef(w *worker, seq kvevents.SeqHash, c *batchCounts) {
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
	if x.removeEntry(seq, w.slot) {
		w.entries--
		c.delta--
	}
}

func (x *Index) clearLocked(w *worker, c *batchCounts) {
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
	w.engines = engMap{}
}

// ClearWorker drops every block held for k (an engine restart, a gap, an
// operator action). The worker keeps its slot.
func (x *Index) ClearWorker(k kvevents.WorkerKey) {
	w := x.lockWorker(k, false)
	if w == nil {
		return
	}
	var c batchCounts
	x.clearLocked(w, &c)
	w.mu.Unlock()
	x.flush(&c)
}

// resync is what a gap or epoch signal does: clear the worker and forget
// its cursor; the batch that triggered it follows through ApplyBatch.
func (x *Index) resync(k kvevents.WorkerKey) {
	x.ctr.resyncs.Add(1)
	w := x.lockWorker(k, false)
	if w == nil {
		return
	}
	var c batchCounts
	x.clearLocked(w, &c)
	w.cursor = kvevents.Cursor{}
	w.mu.Unlock()
	x.flush(&c)
}

// RemoveWorker forgets every rank of worker (it left the fleet): their
// blocks leave the index and their slots become reusable.
func (x *Index) RemoveWorker(worker string) {
	x.wmu.RLock()
	var keys []kvevents.WorkerKey
	for k := range x.workers {
		if k.Worker == worker {
			keys = append(keys, k)
		}
	}
	x.wmu.RUnlock()
	for _, k := range keys {
		x.removeKey(k)
	}
}

// RemoveKey forgets one (worker, rank).
func (x *Index) RemoveKey(k kvevents.WorkerKey) { x.removeKey(k) }

func (x *Index) removeKey(k kvevents.WorkerKey) {
	w := x.lockWorker(k, false)
	if w == nil {
		return
	}
	var c batchCounts
	x.clearLocked(w, &c)
	w.removed = true
	x.wmu.Lock()
	delete(x.workers, k)
	// Every entry of the slot is gone, so it can be handed out again.
	x.free = append(x.free, w.slot)
	x.wmu.Unlock()
	w.mu.Unlock()
	x.flush(&c)
	x.ctr.workersRemoved.Add(1)
}

// LoadWorker replaces everything held for k with blocks, for example a
// dump fetched from the worker after a resync. It is one ordered write of
// k: concurrent lookups may see the old blocks, none, or the new ones.
func (x *Index) LoadWorker(k kvevents.WorkerKey, blocks []kvevents.StoredBlock) {
	x.loadWorker(k, kvevents.Cursor{}, blocks)
}

func (x *Index) loadWorker(k kvevents.WorkerKey, cur kvevents.Cursor, blocks []kvevents.StoredBlock) bool {
	w := x.lockWorker(k, true)
	if w == nil {
		x.ctr.refused.Add(uint64(len(blocks)))
		return false
	}
	var c batchCounts
	x.clearLocked(w, &c)
	if len(blocks) > 0 {
		w.engines.init(len(blocks))
	}
	for _, b := range blocks {
		x.storeLocked(w, b, &c)
	}
	w.cursor = cur
	w.mu.Unlock()
	x.flush(&c)
	return true
}

// Workers returns the (worker, rank) keys the index knows, in no order.
func (x *Index) Workers() []kvevents.WorkerKey {
	x.wmu.RLock()
	defer x.wmu.RUnlock()
	out := make([]kvevents.WorkerKey, 0, len(x.workers))
	for k := range x.workers {
		out = append(out, k)
	}
	return out
}
