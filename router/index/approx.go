package index

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
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
//     Combine with MergeMax: each worker's score is the larger of the two.
//
// Expiry is lazy: expiries sit in a min-heap that holds one node per live
// entry (a re-record only moves the entry's deadline; the stale node is
// re-queued when it surfaces). Record and Prune drop everything expired;
// Lookup drops at most lookupPruneMax expired entries and only when it can
// take the writer lock without waiting, so a lookup may still see an entry
// shortly past its TTL when writes are rare. Call Prune periodically for
// exact expiry.
type Approx struct {
	cfg ApproxConfig
	idx *Index

	mu   sync.Mutex
	ids  map[kvevents.WorkerKey]uint32
	keys []kvevents.WorkerKey // by id
	// exp[id] holds the deadline (Unix ns) of each of that worker's
	// entries: per-worker maps keyed by the hash alone hash faster and
	// stay smaller than one map keyed by (worker, hash).
	exp     []map[kvevents.SeqHash]int64
	entries int
	heap    []heapNode
	buf     []kvevents.SeqHash
	dropped []approxKey  // entries leaving the index, removed in one call per worker
	first   atomic.Int64 // earliest deadline in the heap, MaxInt64 when empty

	recorded, refreshed, expired, evicted atomic.Uint64
}

type approxKey struct {
	id  uint32
	seq kvevents.SeqHash
}

type heapNode struct {
	at  int64
	key approxKey
}

// lookupPruneMax bounds the expiry work a Lookup may do.
const lookupPruneMax = 64

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
		ids: map[kvevents.WorkerKey]uint32{},
	}
	a.first.Store(math.MaxInt64)
	return a
}

// Config returns the configuration with defaults filled.
func (a *Approx) Config() ApproxConfig { return a.cfg }

// Record notes that k will hold hashes (a request's leading blocks) from
// now until now+TTL. Blocks already recorded for k get their TTL restarted.
func (a *Approx) Record(k kvevents.WorkerKey, hashes []kvevents.SeqHash, now time.Time) {
	if len(hashes) == 0 || k.Worker == "" {
		return
	}
	deadline := now.Add(a.cfg.TTL).UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	id, ok := a.ids[k]
	if !ok {
		id = uint32(len(a.keys))
		a.ids[k] = id
		a.keys = append(a.keys, k)
		a.exp = append(a.exp, nil)
	}
	m := a.exp[id]
	if m == nil {
		m = map[kvevents.SeqHash]int64{}
		a.exp[id] = m
	}
	fresh := a.buf[:0]
	refreshed := 0
	for _, h := range hashes {
		if old, ok := m[h]; ok {
			if deadline > old {
				m[h] = deadline
			}
			refreshed++
			continue
		}
		m[h] = deadline
		a.entries++
		a.push(heapNode{deadline, approxKey{id, h}})
		fresh = append(fresh, h)
	}
	a.refreshed.Add(uint64(refreshed))
	a.buf = fresh[:0]
	if len(fresh) > 0 {
		a.idx.storeSeqs(k, fresh)
		a.recorded.Add(uint64(len(fresh)))
	}
	a.pruneLocked(now.UnixNano(), -1)
	if a.entries > a.cfg.MaxBlocks {
		a.evictLocked(int(float64(a.cfg.MaxBlocks) * a.cfg.PruneTarget))
	}
	a.publishFirst()
}

// Lookup is Index.Lookup over the recorded blocks (see Approx for the
// expiry caveat). It does not wait for writers.
func (a *Approx) Lookup(hashes []kvevents.SeqHash, opt LookupOptions, out *Overlaps) {
	if now := a.cfg.Clock().UnixNano(); a.first.Load() <= now && a.mu.TryLock() {
		a.pruneLocked(now, lookupPruneMax)
		a.publishFirst()
		a.mu.Unlock()
	}
	a.idx.Lookup(hashes, opt, out)
}

// Prune drops every entry whose TTL has passed at now.
func (a *Approx) Prune(now time.Time) {
	a.mu.Lock()
	a.pruneLocked(now.UnixNano(), -1)
	a.publishFirst()
	a.mu.Unlock()
}

// RemoveWorker forgets every rank of worker.
func (a *Approx) RemoveWorker(worker string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	gone := map[uint32]bool{}
	for k, id := range a.ids {
		if k.Worker == worker {
			gone[id] = true
		}
	}
	if len(gone) == 0 {
		return
	}
	for id := range gone {
		// Heap nodes are dropped when they surface.
		a.entries -= len(a.exp[id])
		a.exp[id] = nil
	}
	a.idx.RemoveWorker(worker)
}

// pruneLocked removes entries whose deadline is at or before now; at most
// limit of them when limit >= 0.
func (a *Approx) pruneLocked(now int64, limit int) {
	for len(a.heap) > 0 && a.heap[0].at <= now && limit != 0 {
		n := a.pop()
		at, ok := a.exp[n.key.id][n.key.seq]
		switch {
		case !ok: // removed with its worker
		case at > n.at: // re-recorded since: re-queue at its deadline
			a.push(heapNode{at, n.key})
		default:
			a.drop(n.key)
			a.expired.Add(1)
			limit--
		}
	}
	a.flushDropped()
}

// evictLocked removes the entries closest to expiry until target remain.
func (a *Approx) evictLocked(target int) {
	for a.entries > target && len(a.heap) > 0 {
		n := a.pop()
		at, ok := a.exp[n.key.id][n.key.seq]
		switch {
		case !ok:
		case at > n.at:
			a.push(heapNode{at, n.key})
		default:
			a.drop(n.key)
			a.evicted.Add(1)
		}
	}
	a.flushDropped()
}

func (a *Approx) drop(key approxKey) {
	delete(a.exp[key.id], key.seq)
	a.entries--
	a.dropped = append(a.dropped, key)
}

// flushDropped removes the dropped entries from the index, one call (one
// writer-lock acquisition) per worker.
func (a *Approx) flushDropped() {
	d := a.dropped
	if len(d) == 0 {
		return
	}
	slices.SortFunc(d, func(x, y approxKey) int { return int(x.id) - int(y.id) })
	for i := 0; i < len(d); {
		j := i
		seqs := a.buf[:0]
		for ; j < len(d) && d[j].id == d[i].id; j++ {
			seqs = append(seqs, d[j].seq)
		}
		a.idx.removeSeqs(a.keys[d[i].id], seqs...)
		a.buf = seqs[:0]
		i = j
	}
	a.dropped = d[:0]
}

func (a *Approx) publishFirst() {
	if len(a.heap) == 0 {
		a.first.Store(math.MaxInt64)
		return
	}
	a.first.Store(a.heap[0].at)
}

// The expiry heap is 4-ary: half the levels of a binary heap, and a
// node's children share a cache line or two, which matters at 10^6 nodes.

func (a *Approx) push(n heapNode) {
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

func (a *Approx) pop() heapNode {
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
	Entries   int    // live (block, worker) entries
	HeapNodes int    // expiry heap size (one per entry)
	Recorded  uint64 // new entries recorded
	Refreshed uint64 // re-records that restarted a TTL
	Expired   uint64 // entries dropped at their TTL
	Evicted   uint64 // entries dropped by the MaxBlocks cap
	Index     Stats  // the underlying block table
}

// Stats returns counters and sizes.
func (a *Approx) Stats() ApproxStats {
	a.mu.Lock()
	s := ApproxStats{Entries: a.entries, HeapNodes: len(a.heap)}
	a.mu.Unlock()
	s.Recorded, s.Refreshed = a.recorded.Load(), a.refreshed.Load()
	s.Expired, s.Evicted = a.expired.Load(), a.evicted.Load()
	s.Index = a.idx.Stats()
	return s
}

// storeSeqs indexes hashes for k with the sequence hash standing in for
// the engine hash (the router has no engine ids for its own predictions).
func (x *Index) storeSeqs(k kvevents.WorkerKey, hashes []kvevents.SeqHash) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	w := x.worker(k, true)
	if w == nil {
		x.ctr.refused.Add(uint64(len(hashes)))
		return
	}
	var c batchCounts
	var blks [touchChunk]kvevents.StoredBlock
	for len(hashes) > 0 {
		n := min(len(hashes), touchChunk)
		for i, h := range hashes[:n] {
			blks[i] = kvevents.StoredBlock{Engine: kvevents.EngineHash(h), Seq: h}
		}
		x.storeChunk(w, blks[:n], &c)
		hashes = hashes[n:]
	}
	x.flush(&c)
}

func (x *Index) removeSeqs(k kvevents.WorkerKey, hashes ...kvevents.SeqHash) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	w := x.worker(k, false)
	if w == nil {
		return
	}
	var c batchCounts
	for _, h := range hashes {
		if s, ok := w.engines.del(uint64(h)); ok {
			x.dropRef(w, kvevents.SeqHash(s), mix(s), &c)
			c.removed++
		}
	}
	x.flush(&c)
}
