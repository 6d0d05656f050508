package index

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// refModel is the naive reference: per (worker, rank), a map of engine
// hash to sequence hash; a worker holds a block if any of its engine
// hashes maps to it (held counts those engine hashes per block). A
// sequence-keyed worker's blocks are kept under their sequence hash as
// engine hash, which makes a store a set add and a removal a set removal.
type refModel struct {
	tier     kvevents.Tier
	workers  map[workerref.Target]map[kvevents.EngineHash]kvevents.SeqHash
	held     map[workerref.Target]map[kvevents.SeqHash]int
	seqKeyed map[workerref.Target]bool
}

func newRef() *refModel {
	return &refModel{
		workers:  map[workerref.Target]map[kvevents.EngineHash]kvevents.SeqHash{},
		held:     map[workerref.Target]map[kvevents.SeqHash]int{},
		seqKeyed: map[workerref.Target]bool{},
	}
}

func (m *refModel) set(k workerref.Target, e kvevents.EngineHash, s kvevents.SeqHash) {
	m.del(k, e)
	m.workers[k][e] = s
	m.held[k][s]++
}

func (m *refModel) del(k workerref.Target, e kvevents.EngineHash) {
	old, ok := m.workers[k][e]
	if !ok {
		return
	}
	delete(m.workers[k], e)
	if m.held[k][old]--; m.held[k][old] == 0 {
		delete(m.held[k], old)
	}
}

func (m *refModel) ensure(k workerref.Target) {
	if m.workers[k] == nil {
		m.workers[k] = map[kvevents.EngineHash]kvevents.SeqHash{}
		m.held[k] = map[kvevents.SeqHash]int{}
	}
}

func (m *refModel) apply(b *kvevents.Batch) {
	k := b.Key()
	m.ensure(k)
	if m.seqKeyed[k] != b.SeqKeyed { // a change of keying clears
		m.clearKey(k)
		m.seqKeyed[k] = b.SeqKeyed
	}
	for _, ev := range b.Events {
		switch ev.Kind {
		case kvevents.KindStored:
			if ev.Tier != m.tier {
				continue
			}
			for _, blk := range ev.Blocks {
				if b.SeqKeyed {
					blk.Engine = kvevents.EngineHash(blk.Seq)
				}
				m.set(k, blk.Engine, blk.Seq)
			}
		case kvevents.KindRemoved:
			if ev.Tier != m.tier {
				continue
			}
			if b.SeqKeyed {
				for _, s := range ev.RemovedSeqs {
					m.del(k, kvevents.EngineHash(s))
				}
				continue
			}
			for _, e := range ev.Removed {
				m.del(k, e)
			}
		case kvevents.KindCleared: // all tiers
			m.clearKey(k)
		}
	}
}

func (m *refModel) clearKey(k workerref.Target) {
	if m.workers[k] != nil {
		m.workers[k] = map[kvevents.EngineHash]kvevents.SeqHash{}
		m.held[k] = map[kvevents.SeqHash]int{}
	}
}

func (m *refModel) removeWorker(name string) {
	for k := range m.workers {
		if k.Worker == name {
			delete(m.workers, k)
			delete(m.held, k)
			delete(m.seqKeyed, k)
		}
	}
}

func (m *refModel) load(k workerref.Target, blocks []kvevents.StoredBlock) {
	m.workers[k] = nil
	m.ensure(k)
	m.seqKeyed[k] = false
	for _, b := range blocks {
		m.set(k, b.Engine, b.Seq)
	}
}

// lookup mirrors Index.Lookup, including EarlyExit's cut.
func (m *refModel) lookup(hashes []kvevents.SeqHash, opt LookupOptions) (map[workerref.Target]int, bool) {
	out := map[workerref.Target]int{}
	if len(hashes) == 0 {
		return out, false
	}
	for k, held := range m.held {
		if opt.Allowed != nil && !opt.Allowed(k) {
			continue
		}
		d := 0
		for d < len(hashes) && held[hashes[d]] > 0 {
			d++
		}
		if d > 0 {
			out[k] = d
		}
	}
	if !opt.EarlyExit {
		return out, false
	}
	for i := 1; i < len(hashes); i++ {
		var last workerref.Target
		cnt := 0
		for k, d := range out {
			if d >= i {
				cnt++
				last = k
			}
		}
		if cnt == 0 {
			break
		}
		if cnt == 1 {
			out[last] = i
			return out, true
		}
	}
	return out, false
}

func (m *refModel) dump() []WorkerDump {
	var out []WorkerDump
	for k, ws := range m.workers {
		d := WorkerDump{Key: k, SeqKeyed: m.seqKeyed[k]}
		for e, s := range ws {
			if d.SeqKeyed {
				e = 0
			}
			d.Blocks = append(d.Blocks, kvevents.StoredBlock{Engine: e, Seq: s})
		}
		slices.SortFunc(d.Blocks, cmpBlock)
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b WorkerDump) int { return cmpKey(a.Key, b.Key) })
	return out
}

// compareLookup runs one query on x and the reference and fails on any
// difference.
func compareLookup(t testing.TB, x *Index, refs []*refModel, hashes []kvevents.SeqHash, opt LookupOptions, out *Overlaps) {
	t.Helper()
	x.Lookup(hashes, opt, out)
	want := map[workerref.Target]int{}
	wantEarly := false
	if len(refs) == 1 {
		want, wantEarly = refs[0].lookup(hashes, opt)
	} else {
		// Disjoint models (one per writer): merge, then apply the
		// early-exit cut on the union.
		merged := newRef()
		for _, r := range refs {
			for k, ws := range r.workers {
				merged.workers[k] = ws
				merged.held[k] = r.held[k]
			}
		}
		want, wantEarly = merged.lookup(hashes, opt)
	}
	got := map[workerref.Target]int{}
	for _, w := range out.Workers {
		if _, dup := got[w.Key]; dup {
			t.Fatalf("duplicate worker %v in result", w.Key)
		}
		got[w.Key] = w.Blocks
	}
	wantTotal := 0
	for _, d := range want {
		wantTotal = max(wantTotal, d)
	}
	if fmt.Sprint(sortedOverlaps(got)) != fmt.Sprint(sortedOverlaps(want)) || out.Total != wantTotal || out.EarlyExited != wantEarly {
		t.Fatalf("lookup of %d hashes (early=%v allowed=%v):\n got %v total %d early %v\nwant %v total %d early %v",
			len(hashes), opt.EarlyExit, opt.Allowed != nil, sortedOverlaps(got), out.Total, out.EarlyExited,
			sortedOverlaps(want), wantTotal, wantEarly)
	}
}

func sortedOverlaps(m map[workerref.Target]int) []WorkerOverlap {
	out := make([]WorkerOverlap, 0, len(m))
	for k, d := range m {
		out = append(out, WorkerOverlap{k, d})
	}
	slices.SortFunc(out, func(a, b WorkerOverlap) int { return cmpKey(a.Key, b.Key) })
	return out
}

// checkInvariants verifies the block table against the per-worker maps:
// every block a worker's engine map names holds the worker's slot, no
// block holds a slot its owner does not name, counts agree.
func checkInvariants(t testing.TB, x *Index) {
	t.Helper()
	x.wmu.Lock()
	defer x.wmu.Unlock()
	table := map[kvevents.SeqHash][]uint32{}
	blocks := 0
	for i := range x.shards {
		sh := &x.shards[i]
		used := 0
		sh.forEach(func(key uint64, slots []uint32) {
			used++
			if len(slots) == 0 {
				t.Fatalf("block %x has an empty set", key)
			}
			if _, dup := table[kvevents.SeqHash(key)]; dup {
				t.Fatalf("block %x appears twice", key)
			}
			table[kvevents.SeqHash(key)] = slices.Clone(slots)
		})
		if tb := sh.tab.Load(); used != tb.live || tb.used < tb.live || tb.used*4 > int(tb.mask+1)*3 {
			t.Fatalf("shard %d: live %d used %d cap %d, counted %d", i, tb.live, tb.used, tb.mask+1, used)
		}
		// every key must be findable by a reader probe
		sh.forEach(func(key uint64, _ []uint32) {
			if _, _, ok := sh.get(key, mix(key)); !ok {
				t.Fatalf("block %x present but not found by probe", key)
			}
		})
		blocks += used
	}
	bySlot := map[uint32]*worker{}
	var entries int64
	for k, w := range x.workers {
		if w.key != k {
			t.Fatalf("worker %v stored under %v", w.key, k)
		}
		if o := bySlot[w.slot]; o != nil {
			t.Fatalf("slot %d shared by %v and %v", w.slot, o.key, k)
		}
		bySlot[w.slot] = w
		if info := x.info(w.slot); info == nil || info.key != k {
			t.Fatalf("slot %d of %v names %v", w.slot, k, info)
		}
		refs := map[kvevents.SeqHash]uint32{}
		if w.seqKeyed {
			// The table is the only record of a sequence-keyed worker.
			if w.engines.len() != 0 || w.multi != nil {
				t.Fatalf("sequence-keyed %v has %d engine hashes, multi %v", k, w.engines.len(), w.multi)
			}
			for s, slots := range table {
				if slices.Contains(slots, w.slot) {
					refs[s] = 1
				}
			}
		}
		w.engines.each(func(_, s uint64) { refs[kvevents.SeqHash(s)]++ })
		for s, n := range refs {
			if n > 1 && w.multi[s] != n-1 {
				t.Fatalf("%v: seq %x has %d engine refs, multi %d", k, s, n, w.multi[s])
			}
			if !slices.Contains(table[s], w.slot) {
				t.Fatalf("%v holds %x but its slot %d is not in the block's set %v", k, s, w.slot, table[s])
			}
		}
		for s := range w.multi {
			if refs[s] < 2 {
				t.Fatalf("%v: stale multi entry for %x", k, s)
			}
		}
		if w.entries != len(refs) {
			t.Fatalf("%v: entries %d, distinct seqs %d", k, w.entries, len(refs))
		}
		entries += int64(len(refs))
	}
	engineKeyed := 0
	for _, w := range x.workers {
		if !w.seqKeyed {
			engineKeyed++
		}
	}
	if engineKeyed != x.engineKeyed {
		t.Fatalf("%d engine-keyed workers, counted %d", engineKeyed, x.engineKeyed)
	}
	for i := range x.shards {
		if x.shards[i].roomy != (engineKeyed == 0) {
			t.Fatalf("shard %d roomy %v with %d engine-keyed workers", i, x.shards[i].roomy, engineKeyed)
		}
	}
	var inTable int64
	for s, slots := range table {
		for _, sl := range slots {
			inTable++
			w := bySlot[sl]
			if w == nil {
				t.Fatalf("block %x holds slot %d that no worker owns", s, sl)
			}
			found := w.seqKeyed // counted from the table above
			w.engines.each(func(_, v uint64) { found = found || kvevents.SeqHash(v) == s })
			if !found {
				t.Fatalf("block %x holds slot %d of %v, which does not hold it", s, sl, w.key)
			}
		}
	}
	if inTable != entries || x.entries.Load() != entries {
		t.Fatalf("entries: table %d, workers %d, counter %d", inTable, entries, x.entries.Load())
	}
}
