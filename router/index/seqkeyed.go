package index

import (
	"slices"

	"github.com/kvrouter/kvrouter/kvevents"
)

// This file is the write path of a sequence-keyed worker (one whose
// batches set kvevents.Batch.SeqKeyed): its publisher names every stored
// and removed block by sequence hash and has already counted the engine's
// blocks per (sequence hash, tier), so a store is a set add and a removal
// a set removal, straight on the block table. No engine map is kept for
// such a worker, and that map is what an engine-keyed block costs beyond
// the table (BenchmarkApply: keying=seq against keying=engine).
//
// The price is paid where it is rare: clearing, removing, dumping or
// snapshotting a sequence-keyed worker walks the block table (every shard)
// for its slot instead of walking its own map, milliseconds per million
// entries, under the write lock; lookups do not wait for it.

// seqStoreChunk stores up to touchChunk blocks of a sequence-keyed worker,
// touching their table buckets first so the misses overlap (storeChunk).
func (x *Index) seqStoreChunk(w *worker, blks []kvevents.StoredBlock, c *batchCounts) {
	var sh [touchChunk]uint64
	var sink uint64
	for i := range blks {
		sh[i] = mix(uint64(blks[i].Seq))
		sink += x.shardOf(sh[i]).touch(sh[i])
	}
	w.sink += sink
	for i := range blks {
		if (x.cfg.MaxEntries > 0 && x.entries.Load()+c.delta >= x.cfg.MaxEntries) ||
			(w.limit > 0 && w.entries >= w.limit) {
			c.refused++
			continue
		}
		if x.shardOf(sh[i]).add(uint64(blks[i].Seq), sh[i], w.slot) {
			w.entries++
			c.delta++
			c.stored++
		} else {
			c.dup++
		}
	}
}

// seqRemoveChunk removes up to touchChunk sequence hashes of a
// sequence-keyed worker.
func (x *Index) seqRemoveChunk(w *worker, rm []kvevents.SeqHash, c *batchCounts) {
	var sh [touchChunk]uint64
	var sink uint64
	for i, s := range rm {
		sh[i] = mix(uint64(s))
		sink += x.shardOf(sh[i]).touch(sh[i])
	}
	w.sink += sink
	for i, s := range rm {
		if x.shardOf(sh[i]).remove(uint64(s), sh[i], w.slot) {
			w.entries--
			c.delta--
			c.removed++
		} else {
			c.unknown++
		}
	}
}

// seqKeys walks the block table once and appends, for every slot in want,
// the sequence hashes it holds. wmu is held.
func (x *Index) seqKeys(want map[uint32]*[]kvevents.SeqHash) {
	for i := range x.shards {
		x.shards[i].forEach(func(key uint64, slots []uint32) {
			for _, s := range slots {
				if dst, ok := want[s]; ok {
					*dst = append(*dst, kvevents.SeqHash(key))
				}
			}
		})
	}
}

// clearSeqKeyed drops every block of a sequence-keyed worker: one walk of
// the table for its keys, then their removal. wmu is held.
func (x *Index) clearSeqKeyed(w *worker, c *batchCounts) {
	if w.entries == 0 {
		return
	}
	keys := make([]uint64, 0, w.entries)
	for i := range x.shards {
		keys = x.shards[i].appendKeysOf(keys, w.slot)
	}
	for _, s := range keys {
		if x.removeEntry(kvevents.SeqHash(s), w.slot) {
			w.entries--
			c.delta--
		}
	}
}

// clearSeqKeyedAll clears several sequence-keyed workers (the ranks of one
// worker leaving) with one walk of the table instead of one each. wmu is
// held.
func (x *Index) clearSeqKeyedAll(ws []*worker, c *batchCounts) {
	keys := make(map[uint32]*[]kvevents.SeqHash, len(ws))
	bySlot := make(map[uint32]*worker, len(ws))
	for _, w := range ws {
		if w.seqKeyed && w.entries > 0 {
			keys[w.slot] = new([]kvevents.SeqHash)
			bySlot[w.slot] = w
		}
	}
	if len(keys) < 2 {
		for _, w := range bySlot {
			x.clearSeqKeyed(w, c)
		}
		return
	}
	x.seqKeys(keys)
	for slot, seqs := range keys {
		w := bySlot[slot]
		for _, s := range *seqs {
			if x.removeEntry(s, slot) {
				w.entries--
				c.delta--
			}
		}
	}
}

// setKeying puts w in the keying its latest batch uses. A worker whose
// publisher changed keying (a bridge restarted with the other setting)
// is cleared first, as on a resync: its old blocks are named the other
// way, so later removals could not find them.
func (x *Index) setKeying(w *worker, seqKeyed bool, c *batchCounts) {
	if w.seqKeyed == seqKeyed {
		return
	}
	if w.entries > 0 || w.engines.len() > 0 {
		x.clearLocked(w, c)
		x.ctr.rekeyed.Add(1)
	}
	x.setSeqKeyed(w, seqKeyed)
}

// setSeqKeyed sets w's keying and keeps Index.engineKeyed in step.
func (x *Index) setSeqKeyed(w *worker, seqKeyed bool) {
	switch {
	case w.seqKeyed == seqKeyed:
		return
	case seqKeyed:
		x.countKeying(-1)
	default:
		x.countKeying(1)
	}
	w.seqKeyed = seqKeyed
}

// countKeying adds delta to the engine-keyed workers and, when that makes
// every worker sequence-keyed or ends it, switches the block tables'
// headroom rule (capFor). The tables take the new rule at their next
// rebuild. wmu is held.
func (x *Index) countKeying(delta int) {
	was := x.engineKeyed == 0
	x.engineKeyed += delta
	if now := x.engineKeyed == 0; now != was {
		for i := range x.shards {
			x.shards[i].roomy = now
		}
	}
}

// seqDumps fills the blocks of every sequence-keyed worker in ws (keyed by
// slot) with one walk, sorted by sequence hash. wmu is held.
func (x *Index) seqDumps(ws map[uint32]*WorkerDump) {
	want := make(map[uint32]*[]kvevents.SeqHash, len(ws))
	for slot := range ws {
		want[slot] = new([]kvevents.SeqHash)
	}
	x.seqKeys(want)
	for slot, d := range ws {
		seqs := *want[slot]
		slices.Sort(seqs)
		d.Blocks = make([]kvevents.StoredBlock, len(seqs))
		for i, s := range seqs {
			d.Blocks[i] = kvevents.StoredBlock{Seq: s}
		}
	}
}
