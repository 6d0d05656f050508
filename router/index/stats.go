package index

import (
	"slices"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// Memory model used by Stats.Bytes: the block table and the per-worker
// engine maps cost 16 bytes per bucket (key + value) at a load factor
// between 3/8 and 3/4, counted from their real capacities; the rare
// multi-reference Go map entries cost about engineEntryBytes.
// BenchmarkMemoryPerEntry measures the real heap growth per entry.
const (
	engineEntryBytes = 26
	workerBytes      = 256 // worker struct, map headers, slot info
)

// Stats describes the index at one moment. Counters are totals since New.
type Stats struct {
	Workers int   // (worker, rank) keys known
	Blocks  int   // distinct sequence hashes indexed
	Entries int64 // (block, worker) pairs
	BigSets int   // blocks held by more workers than fit inline

	// Bytes estimates the memory held (tables, big sets, engine maps);
	// BytesPerEntry is Bytes/Entries.
	Bytes         int64
	BytesPerEntry float64

	StreamSeq uint64 // highest stream sequence applied

	Batches             uint64 // batches applied
	Events              uint64 // events seen in applied batches
	Stored              uint64 // blocks stored
	DuplicateStores     uint64 // stores of a block the worker already held (under the same engine hash, when engine-keyed)
	Removed             uint64 // blocks removed
	UnknownRemovals     uint64 // removals of engine (or, sequence-keyed, sequence) hashes the worker did not hold
	Cleared             uint64 // Cleared events
	OrphanStores        uint64 // stores whose parent the worker did not hold (indexed anyway)
	ReboundEngineHashes uint64 // stores that reused an engine hash for other content
	IgnoredTier         uint64 // events of a tier this index does not score
	RefusedStores       uint64 // stores refused by MaxEntries / MaxEntriesPerWorker / slot exhaustion
	ForeignModel        uint64 // batches for another model
	BadEvents           uint64 // events of an unknown kind
	BadBatches          uint64 // nil batches or batches without a worker
	Resyncs             uint64 // resync signals handled
	WorkersRemoved      uint64 // (worker, rank) keys removed
	Rekeyed             uint64 // workers cleared because their batches changed keying (kvevents.Batch.SeqKeyed)
}

// Stats returns counts and a memory estimate. It takes the write lock for
// a walk over shards and workers, so it is for metrics, not the hot path.
func (x *Index) Stats() Stats {
	var s Stats
	var bytes int64
	x.wmu.Lock()
	for i := range x.shards {
		sh := &x.shards[i]
		t := sh.tab.Load()
		s.Blocks += t.live
		s.BigSets += sh.nbig
		bytes += int64(t.mask+1)*16 + int64(sh.bigMem) + int64(cap(sh.bigs.Load().p))*8
	}
	s.Workers = len(x.workers)
	for _, w := range x.workers {
		bytes += int64(w.engines.bytes()) + int64(len(w.multi))*engineEntryBytes + workerBytes
	}
	slotCap := len(x.slots.Load().p)
	x.wmu.Unlock()
	bytes += int64(slotCap) * 8
	s.Entries = x.entries.Load()
	s.Bytes = bytes
	if s.Entries > 0 {
		s.BytesPerEntry = float64(bytes) / float64(s.Entries)
	}
	s.StreamSeq = x.streamSeq.Load()
	c := &x.ctr
	s.Batches = c.batches.Load()
	s.Events = c.events.Load()
	s.Stored = c.stored.Load()
	s.DuplicateStores = c.dupStores.Load()
	s.Removed = c.removed.Load()
	s.UnknownRemovals = c.unknownRemovals.Load()
	s.Cleared = c.cleared.Load()
	s.OrphanStores = c.orphanStores.Load()
	s.ReboundEngineHashes = c.rebound.Load()
	s.IgnoredTier = c.ignoredTier.Load()
	s.RefusedStores = c.refused.Load()
	s.ForeignModel = c.foreignModel.Load()
	s.BadEvents = c.badEvents.Load()
	s.BadBatches = c.badBatches.Load()
	s.Resyncs = c.resyncs.Load()
	s.WorkersRemoved = c.workersRemoved.Load()
	s.Rekeyed = c.rekeyed.Load()
	return s
}

// WorkerDump is one (worker, rank)'s indexed state.
type WorkerDump struct {
	Key    workerref.Target
	Cursor kvevents.Cursor // zero when its batches carried no event ids
	// Blocks sorted by engine hash, then sequence hash. A sequence-keyed
	// worker's blocks have Engine 0, so they are sorted by sequence hash.
	Blocks []kvevents.StoredBlock
	// SeqKeyed: the worker's batches name blocks by sequence hash
	// (kvevents.Batch.SeqKeyed).
	SeqKeyed bool
}

// Dump returns every worker's blocks, sorted by key. It takes the write
// lock once per engine-keyed worker, not for the whole walk, so event
// application goes on meanwhile, and once for all sequence-keyed workers,
// whose blocks one walk of the block table finds: each worker is
// consistent, the whole is exact only if no batch is applied during the
// call. Two indexes with equal dumps answer every lookup alike.
func (x *Index) Dump() []WorkerDump {
	out := make([]WorkerDump, 0, len(x.Workers()))
	out = x.dumpSeqKeyed(out)
	for _, k := range x.Workers() {
		x.wmu.Lock()
		w := x.workers[k]
		if w == nil || w.seqKeyed {
			x.wmu.Unlock()
			continue
		}
		d := WorkerDump{Key: w.key, Cursor: w.cursor, Blocks: make([]kvevents.StoredBlock, 0, w.engines.len())}
		w.engines.each(func(e, s uint64) {
			d.Blocks = append(d.Blocks, kvevents.StoredBlock{Engine: kvevents.EngineHash(e), Seq: kvevents.SeqHash(s)})
		})
		x.wmu.Unlock()
		slices.SortFunc(d.Blocks, cmpBlock)
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b WorkerDump) int { return cmpKey(a.Key, b.Key) })
	return out
}

// dumpSeqKeyed appends the dumps of every sequence-keyed worker to out.
func (x *Index) dumpSeqKeyed(out []WorkerDump) []WorkerDump {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	ws := make(map[uint32]*WorkerDump)
	for _, w := range x.workers {
		if w.seqKeyed {
			ws[w.slot] = &WorkerDump{Key: w.key, Cursor: w.cursor, SeqKeyed: true}
		}
	}
	if len(ws) == 0 {
		return out
	}
	x.seqDumps(ws)
	for _, d := range ws {
		out = append(out, *d)
	}
	return out
}

// WorkerBlocks returns how many blocks the index holds for k: the length
// of k's Dump().Blocks (for an engine-keyed worker one per engine hash, so
// content stored under two engine hashes counts twice), or 0 when k is
// unknown. The count is kept
// as events apply, so this is one writer-lock acquisition and a map
// lookup, not a walk: cheap enough for every status request.
func (x *Index) WorkerBlocks(k workerref.Target) int {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	if w := x.workers[k]; w != nil {
		if w.seqKeyed {
			return w.entries
		}
		return w.engines.len()
	}
	return 0
}

func cmpBlock(a, b kvevents.StoredBlock) int {
	switch {
	case a.Engine < b.Engine:
		return -1
	case a.Engine > b.Engine:
		return 1
	case a.Seq < b.Seq:
		return -1
	case a.Seq > b.Seq:
		return 1
	}
	return 0
}

// Cursors returns where each (worker, rank) stands in its event sequence
// (kvevents.CursorSource): a subscriber replaying the stream into an index
// restored from a snapshot skips the events each worker already reflects
// and signals a restart or a gap in between. Workers whose batches carried
// no event ids (or that were bulk-loaded) are left out, so their first
// batch is taken as it comes.
func (x *Index) Cursors() map[workerref.Target]kvevents.Cursor {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	out := make(map[workerref.Target]kvevents.Cursor, len(x.workers))
	for k, w := range x.workers {
		if w.cursor.NextID != 0 {
			out[k] = w.cursor
		}
	}
	return out
}
