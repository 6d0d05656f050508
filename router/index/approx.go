package index

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// Defaults of ApproxConfig (Dynamo's PruneConfig values).
const (
	DefaultApproxTTL         = 120 * time.Second
	DefaultPredictedTTL      = 5 * time.Second
	DefaultApproxMaxBlocks   = 1 << 20
	DefaultApproxPruneTarget = 0.8
)

// ApproxConfig sets up an Approx.
type ApproxConfig struct {
	// TTL is how long a recorded block counts as cached; recording it
	// again restarts the clock. Default DefaultApproxTTL (120 s); a
	// predicted index uses a few seconds (DefaultPredictedTTL).
	TTL time.Duration
	// MaxBlocks caps the (block, worker) entries (default 2^20). Past it,
	// the entries closest to expiry (the least recently recorded) are
	// evicted until PruneTarget × MaxBlocks remain (default 0.8).
	MaxBlocks   int
	PruneTarget float64
	// Clock is the time source of Lookup's opportunistic expiry (default
	// time.Now); tests inject a fake one. Record and Prune take the time
	// as an argument.
	Clock func() time.Time
	// Shards of the underlying block table (see Config.Shards).
	Shards int
}

// Approx is an index fed by the router's own routing decisions rather than
// by engine events: Record(worker, hashes) says "this worker is about to
// hold these blocks". It serves two uses:
//
//   - approximate mode, for engines that publish no events (TTL 120 s);
//   - the predicted index next to the event-fed one (TTL a few seconds),
//     which covers the window between a routing decision and the Stored
//     events it causes, so a burst of sibling requests does not scatter.
//     The scheduler takes each worker's larger overlap of the two
//     (router/host passes both, the event-fed one marked as reported).
//
// Expiry is per Record call, not per block: all blocks of one call share
// one deadline, so each call is one expiry record and the deadline heap
// holds one node per call. For every entry, the worker's table (the
// index's own per-worker table, in identity mode, so no second table is
// probed) names the record that owns its deadline: the latest call that
// named it. Every live entry also sits in the list of exactly one record,
// its holder: the call that added it, or a later one it was moved to. A
// re-record repoints the owner and does nothing else (one probe, no heap
// or list work), so a hot prefix stays cheap. When a record's deadline
// passes, its list is walked: entries it still owns are dropped; entries
// re-recorded since move to their owner's list. Owners only ever move to
// later deadlines, so a holder surfaces no later than the owner and expiry
// stays exact; an entry that is re-recorded all the time moves about once
// per TTL.
//
// Expiry is lazy: Record and Prune drop everything expired; Lookup works
// through at most lookupPruneMax queued blocks and only when it can take
// the writer lock without waiting, so a lookup may still see an entry
// shortly past its TTL when writes are rare. Call Prune periodically for
// exact expiry.
type Approx struct {
	cfg ApproxConfig
	idx *Index // written only by this Approx, with mu held

	mu       sync.Mutex
	ids      map[workerref.Target]uint32
	ws       []approxWorker // by id
	recs     []approxRec    // by handle; freed handles are in freeRecs
	freeRecs []uint32
	heap     []expiryNode // min-heap of live records by deadline
	// lists holds free record lists by capacity class (1<<class hashes),
	// so that steady-state recording does not allocate.
	lists   [listClasses][][]kvevents.SeqHash
	pooled  int          // capacity (in hashes) of the lists in the pool
	entries int          // live (block, worker) entries
	queued  int          // hashes in record lists: entries + those of removed workers
	first   atomic.Int64 // earliest deadline in the heap, MaxInt64 when empty

	recorded, refreshed, expired, evicted atomic.Uint64
}

type approxWorker struct {
	key workerref.Target
	// w is the index's state of key (nil until the first Record and after
	// RemoveWorker). Its engine table, in identity mode, maps each entry's
	// sequence hash to the handle of the record owning its deadline.
	w *worker
	// gen is bumped by RemoveWorker: records of an older generation are
	// void and are freed without looking at any table.
	gen uint32
}

// approxRec is one Record call: its deadline and the entries it holds.
type approxRec struct {
	deadline int64
	id, gen  uint32 // worker and its generation at the call
	hashes   []kvevents.SeqHash
}

type expiryNode struct {
	at  int64
	rec uint32
}

const (
	// lookupPruneMax bounds the expiry work (queued blocks looked at) a
	// Lookup may do.
	lookupPruneMax = 64
	// approxChunk is how many blocks Record and expiry touch ahead at
	// once. Larger than an event's touchChunk: the blocks of one call hit
	// the same few pages of one worker's table, and each batch of touches
	// waits out about one page walk (hundreds of ns under nested paging)
	// however many loads it overlaps, so fewer, wider batches win.
	approxChunk  = 128
	listClasses  = 40
	minListClass = 3
	// poolSlack is how much list capacity the pool may hold beyond the
	// hashes queued, so a burst does not pin memory for good.
	poolSlack = 1 << 16
)

// NewApprox returns an empty approximate index.
func NewApprox(cfg ApproxConfig) *Approx {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultApproxTTL
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultApproxMaxBlocks
	}
	if cfg.PruneTarget <= 0 || cfg.PruneTarget >= 1 {
		cfg.PruneTarget = DefaultApproxPruneTarget
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	a := &Approx{
		cfg: cfg,
		idx: New(Config{Shards: cfg.Shards}),
		ids: map[workerref.Target]uint32{},
	}
	a.first.Store(math.MaxInt64)
	return a
}

// Config returns the configuration with defaults filled.
func (a *Approx) Config() ApproxConfig { return a.cfg }

// Record notes that k will hold hashes (a request's leading blocks) from
// now until now+TTL. Blocks already recorded for k get their TTL restarted
// (a deadline only ever moves later). hashes must start at the prompt's
// first block: Lookup's bisection relies on every record being a prefix.
func (a *Approx) Record(k workerref.Target, hashes []kvevents.SeqHash, now time.Time) {
	if len(hashes) == 0 || k.Worker == "" {
		return
	}
	deadline := now.Add(a.cfg.TTL).UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.idx.wmu.Lock()
	defer a.idx.wmu.Unlock()
	id := a.workerID(k)
	w := a.recordingWorker(k, id, len(hashes))
	if w == nil {
		return
	}
	// Consecutive blocks usually share their previous owner (the last
	// call that named the prefix): rc remembers its deadline.
	rc := approxRecording{w: w, rec: a.newRec(deadline, id, a.ws[id].gen), deadline: deadline, last: ^uint64(0)}
	for len(hashes) > 0 {
		n := min(len(hashes), approxChunk)
		a.recordChunk(&rc, hashes[:n], len(hashes)-n)
		hashes = hashes[n:]
	}
	if rc.refreshed > 0 {
		a.refreshed.Add(uint64(rc.refreshed))
	}
	if rc.c.stored > 0 {
		a.recorded.Add(rc.c.stored)
	}
	a.idx.flush(&rc.c)
	a.pruneLocked(now.UnixNano(), -1)
	if a.entries > a.cfg.MaxBlocks {
		a.evictLocked(int(float64(a.cfg.MaxBlocks) * a.cfg.PruneTarget))
	}
	a.publishFirst()
}

// approxRecording is the state of one Record call across its chunks.
type approxRecording struct {
	w         *worker
	rec       uint32 // the call's record handle
	deadline  int64
	last      uint64 // the previous owner seen, and its deadline
	lastAt    int64
	refreshed int
	c         batchCounts
}

// recordingWorker returns the index's worker of k (id), creating it in
// identity mode on its first Record; nil when every worker slot is taken
// (the n hashes are counted refused).
func (a *Approx) recordingWorker(k workerref.Target, id uint32, n int) *worker {
	aw := &a.ws[id]
	if aw.w == nil {
		if aw.w = a.idx.worker(k, true); aw.w == nil {
			a.idx.ctr.refused.Add(uint64(n)) // every slot taken
			return nil
		}
		aw.w.engines.ident = true
	}
	return aw.w
}

// recordChunk records one chunk of at most approxChunk hashes, rest more
// following: a block the worker's table already holds gets the call as
// its owner when that moves its deadline later, a new one is inserted in
// the table and handed to addFresh.
func (a *Approx) recordChunk(rc *approxRecording, chunk []kvevents.SeqHash, rest int) {
	w := rc.w
	var mh, sh [approxChunk]uint64
	var fresh [approxChunk]kvevents.SeqHash
	var sink uint64
	for i, h := range chunk {
		mh[i] = mix(uint64(h))
		sink += w.engines.touch(mh[i])
	}
	// The loop's state in locals, written back after it.
	r, deadline, last, lastAt, refreshed := rc.rec, rc.deadline, rc.last, rc.lastAt, 0
	nf := 0
	for i, h := range chunk {
		at, o, found := w.engines.probeWord(uint64(h), mh[i])
		if !found {
			if h == 0 {
				w.engines.put(0, ownerWord(r, 0))
			} else {
				w.engines.insertProbed(at, uint64(h), mh[i], ownerWord(r, mh[i]))
			}
			fresh[nf], sh[nf] = h, mh[i]
			nf++
			continue
		}
		refreshed++
		if o = uint64(uint32(o)); o != last {
			last, lastAt = o, a.recs[o].deadline
		}
		if deadline > lastAt {
			if h == 0 {
				w.engines.put(0, ownerWord(r, 0))
			} else {
				w.engines.s[2*at+1] = ownerWord(r, mh[i])
			}
		}
	}
	rc.last, rc.lastAt, rc.refreshed = last, lastAt, rc.refreshed+refreshed
	if nf > 0 {
		sink += a.addFresh(rc, fresh[:nf], sh[:nf], rest)
	}
	w.sink += sink
}

// addFresh adds the blocks new to the worker (fresh, their mixed hashes
// sh) to the index's shards and to the call's record list, sized on the
// first chunk for the rest still to come. It returns the touch sink.
func (a *Approx) addFresh(rc *approxRecording, fresh []kvevents.SeqHash, sh []uint64, rest int) uint64 {
	x, w := a.idx, rc.w
	var sink uint64
	// A tight loop of independent loads overlaps their misses; inside the
	// classifying loop of recordChunk only a few would.
	for i := range sh {
		sink += x.shardOf(sh[i]).touch(sh[i])
	}
	for i, h := range fresh {
		if x.shardOf(sh[i]).add(uint64(h), sh[i], w.slot) {
			w.entries++
			rc.c.delta++
		}
	}
	rc.c.stored += uint64(len(fresh))
	rec := &a.recs[rc.rec]
	if rec.hashes == nil {
		// Room for every block still to come, so later chunks never grow
		// the list outside the pool.
		rec.hashes = a.getList(len(fresh) + rest)
	}
	rec.hashes = append(rec.hashes, fresh...)
	a.entries += len(fresh)
	a.queued += len(fresh)
	return sink
}

// Lookup is Index.Lookup over the recorded blocks (see Approx for the
// expiry caveat). It does not wait for writers. Since every Record names a
// prompt's leading blocks, the recorded sets nest along each prompt, and
// once few workers are left Lookup finds their depths by bisection
// (Index.bisect): about log2 of the prompt's blocks in probes per depth
// instead of one per block.
func (a *Approx) Lookup(hashes []kvevents.SeqHash, opt LookupOptions, out *Overlaps) {
	if now := a.cfg.Clock().UnixNano(); a.first.Load() <= now && a.mu.TryLock() {
		if a.idx.wmu.TryLock() { // Stats may hold it for a while
			a.pruneLocked(now, lookupPruneMax)
			a.publishFirst()
			a.idx.wmu.Unlock()
		}
		a.mu.Unlock()
	}
	a.idx.lookup(hashes, opt, out, true)
}

// Prune drops every entry whose TTL has passed at now.
func (a *Approx) Prune(now time.Time) {
	a.mu.Lock()
	a.idx.wmu.Lock()
	a.pruneLocked(now.UnixNano(), -1)
	a.publishFirst()
	a.idx.wmu.Unlock()
	a.mu.Unlock()
}

// RemoveWorker forgets every rank of worker.
func (a *Approx) RemoveWorker(worker string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.idx.wmu.Lock()
	found := false
	for k, id := range a.ids {
		aw := &a.ws[id]
		if k.Worker != worker || aw.w == nil {
			continue
		}
		// Its records are now void; they are freed when they surface.
		a.entries -= aw.w.engines.len()
		aw.w = nil
		aw.gen++
		found = true
	}
	a.idx.wmu.Unlock()
	if found {
		a.idx.RemoveWorker(worker)
	}
}

// ownerWord is the value word of an entry in an Approx worker's table: the
// handle of the record owning its deadline, and above it the low 32 bits
// of h = mix(seq), which the table keeps there in identity mode.
func ownerWord(rec uint32, h uint64) uint64 { return uint64(rec) | h<<32 }

func (a *Approx) workerID(k workerref.Target) uint32 {
	id, ok := a.ids[k]
	if !ok {
		id = uint32(len(a.ws))
		a.ids[k] = id
		a.ws = append(a.ws, approxWorker{key: k})
	}
	return id
}

// newRec starts the record of one Record call and queues it.
func (a *Approx) newRec(deadline int64, id, gen uint32) uint32 {
	var h uint32
	if n := len(a.freeRecs); n > 0 {
		h = a.freeRecs[n-1]
		a.freeRecs = a.freeRecs[:n-1]
	} else {
		h = uint32(len(a.recs))
		a.recs = append(a.recs, approxRec{})
	}
	a.recs[h] = approxRec{deadline: deadline, id: id, gen: gen}
	a.push(expiryNode{deadline, h})
	return h
}

// pruneLocked drops entries whose deadline is at or before now, looking at
// no more than limit queued hashes when limit >= 0. mu and idx.wmu held,
// like every helper below.
func (a *Approx) pruneLocked(now int64, limit int) {
	for len(a.heap) > 0 && a.heap[0].at <= now && limit != 0 {
		limit = a.drain(now, limit, -1, &a.expired)
	}
}

// evictLocked drops the entries closest to expiry until target remain.
func (a *Approx) evictLocked(target int) {
	for a.entries > target && len(a.heap) > 0 {
		a.drain(math.MinInt64, -1, target, &a.evicted)
	}
}

// drain works through the list of the record at the top of the heap, last
// hash first. An entry the record still owns is dropped (counted in ctr);
// one re-recorded since moves to its owner's list, unless that owner's
// deadline is also at or before now, in which case it is dropped too.
// Hashes of a void record are just discarded. drain stops after budget
// hashes (budget < 0: no limit) or once entries <= floor, frees the record
// when its list is empty, and returns the budget left.
func (a *Approx) drain(now int64, budget, floor int, ctr *atomic.Uint64) int {
	hd := a.heap[0].rec
	r := &a.recs[hd]
	aw := &a.ws[r.id]
	void := r.gen != aw.gen || aw.w == nil
	list := r.hashes
	var c batchCounts
	for len(list) > 0 && budget != 0 && a.entries > floor {
		n := min(len(list), approxChunk)
		if budget > 0 {
			n = min(n, budget)
			budget -= n
		}
		chunk := list[len(list)-n:]
		list = list[:len(list)-n]
		a.queued -= n
		if void {
			continue
		}
		if back := a.drainChunk(hd, aw.w, chunk, now, floor, &c); back > 0 {
			// Stopped at floor: put back what is left of the chunk.
			list = list[:len(list)+back]
			a.queued += back
			if budget >= 0 {
				budget += back
			}
		}
	}
	if c.removed > 0 {
		ctr.Add(c.removed)
		a.idx.flush(&c)
	}
	if len(list) > 0 {
		r.hashes = list
		return budget
	}
	a.pop()
	a.putList(r.hashes)
	*r = approxRec{}
	a.freeRecs = append(a.freeRecs, hd)
	return budget
}

// drainChunk drains one chunk of record hd's list (worker w's), last hash
// first, as drain describes, counting removals in c. If entries fall to
// floor first it stops and returns how many hashes, from the chunk's
// start, it left untouched; else 0.
func (a *Approx) drainChunk(hd uint32, w *worker, chunk []kvevents.SeqHash, now int64, floor int, c *batchCounts) (back int) {
	x, r := a.idx, &a.recs[hd]
	var mh, sh [approxChunk]uint64
	var gone [approxChunk]kvevents.SeqHash
	var sink uint64
	for i, h := range chunk {
		// Most entries of a record that surfaces are dropped: touch
		// their block-table buckets too, while the loads can overlap.
		mh[i] = mix(uint64(h))
		sink += w.engines.touch(mh[i]) + x.shardOf(mh[i]).touch(mh[i])
	}
	ng := 0
	for i := len(chunk) - 1; i >= 0; i-- {
		h := chunk[i]
		if a.entries <= floor {
			back = i + 1
			break
		}
		at, o, ok := w.engines.probeWord(uint64(h), mh[i])
		if !ok {
			continue // a duplicate within one call, already dropped
		}
		o = uint64(uint32(o))
		if o != uint64(hd) {
			if or := &a.recs[o]; or.deadline > now && or.id == r.id && or.gen == r.gen {
				or.hashes = a.appendList(or.hashes, h)
				a.queued++
				continue
			}
		}
		if h == 0 {
			w.engines.del(0)
		} else {
			w.engines.deleteAt(at)
		}
		a.entries--
		gone[ng], sh[ng] = h, mh[i]
		ng++
	}
	w.sink += sink
	for i, h := range gone[:ng] {
		if x.shardOf(sh[i]).remove(uint64(h), sh[i], w.slot) {
			w.entries--
			c.delta--
		}
	}
	c.removed += uint64(ng)
	return back
}

// Record lists come from a pool of power-of-two capacities.

func listClass(n int) int { return max(bits.Len(uint(n-1)), minListClass) }

func (a *Approx) getList(n int) []kvevents.SeqHash {
	c := listClass(n)
	if c < listClasses {
		if p := a.lists[c]; len(p) > 0 {
			l := p[len(p)-1]
			p[len(p)-1] = nil
			a.lists[c] = p[:len(p)-1]
			a.pooled -= cap(l)
			return l
		}
	}
	return make([]kvevents.SeqHash, 0, 1<<c)
}

func (a *Approx) putList(l []kvevents.SeqHash) {
	c := bits.Len(uint(cap(l))) - 1
	if cap(l) == 0 || cap(l) != 1<<c || c >= listClasses || a.pooled+cap(l) > a.queued+poolSlack {
		return // not one of ours, or the pool is big enough: leave it to the GC
	}
	a.lists[c] = append(a.lists[c], l[:0])
	a.pooled += cap(l)
}

func (a *Approx) appendList(l []kvevents.SeqHash, x kvevents.SeqHash) []kvevents.SeqHash {
	if len(l) == cap(l) {
		nl := append(a.getList(len(l)+1), l...)
		a.putList(l)
		l = nl
	}
	return append(l, x)
}

func (a *Approx) publishFirst() {
	if len(a.heap) == 0 {
		a.first.Store(math.MaxInt64)
		return
	}
	a.first.Store(a.heap[0].at)
}

// The expiry heap is 4-ary: half the levels of a binary heap, and a
// node's children share a cache line. Deadlines mostly arrive in order,
// so a push rarely moves.

func (a *Approx) push(n expiryNode) {
	a.heap = append(a.heap, n)
	h := a.heap
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if h[p].at <= n.at {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = n
}

func (a *Approx) pop() expiryNode {
	h := a.heap
	top := h[0]
	last := h[len(h)-1]
	h = h[:len(h)-1]
	a.heap = h
	if len(h) == 0 {
		return top
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= len(h) {
			break
		}
		m := c
		for k := c + 1; k < c+4 && k < len(h); k++ {
			if h[k].at < h[m].at {
				m = k
			}
		}
		if last.at <= h[m].at {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = last
	return top
}

// ApproxStats describes an Approx.
type ApproxStats struct {
	Entries int // live (block, worker) entries
	// HeapNodes counts the blocks queued for expiry in record lists: one
	// per live entry, plus those of removed workers until their deadline.
	HeapNodes int
	Records   int    // expiry records (Record calls) in the deadline heap
	Recorded  uint64 // new entries recorded
	Refreshed uint64 // re-records that restarted a TTL
	Expired   uint64 // entries dropped at their TTL
	Evicted   uint64 // entries dropped by the MaxBlocks cap
	Index     Stats  // the underlying block table
}

// Stats returns counters and sizes.
func (a *Approx) Stats() ApproxStats {
	a.mu.Lock()
	s := ApproxStats{Entries: a.entries, HeapNodes: a.queued, Records: len(a.heap)}
	a.mu.Unlock()
	s.Recorded, s.Refreshed = a.recorded.Load(), a.refreshed.Load()
	s.Expired, s.Evicted = a.expired.Load(), a.evicted.Load()
	s.Index = a.idx.Stats()
	return s
}
