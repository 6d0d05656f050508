package scheduler

import "github.com/kvrouter/kvrouter/kvevents"

// holderTable maps a seq hash to the workers (slots) whose active bookings
// name it, with a count per worker: the refcounts that count a prompt block
// shared by active requests once per worker (booking.go). A route books
// and releases its whole prompt, 128 hashes at 2,048 tokens, so this is
// on every route twice; a Go map of slices cost about a third of the
// route in process here (docs/benchmarks/scheduler.md). It is open
// addressing with linear probing over a power-of-two array, the first
// holder inline (a block is mostly active on one worker), further holders
// in pooled lists. Hashes can come from clients (block_hashes), so the
// home position mixes them with a per-table random seed.
type holderTable struct {
	e     []holderEntry
	mask  uint64
	n     int // occupied entries
	seed  uint64
	lists [][]holder // further holders of an entry (entry.more-1)
	free  []int32    // unused lists
	sink  uint64     // folds the touched words, so the touches stay
}

// holderEntry is one seq hash; first.n == 0 marks an empty entry.
type holderEntry struct {
	h     kvevents.SeqHash
	first holder
	more  int32  // 1 + index in lists of the further holders; 0: none
	mix   uint32 // mixed hash, home before the mask (deletion and growth move entries)
}

const holderTableMin = 256

func newHolderTable() holderTable {
	return holderTable{e: make([]holderEntry, holderTableMin), mask: holderTableMin - 1, seed: randomSeed()}
}

// len is the number of seq hashes held by some worker.
func (t *holderTable) len() int { return t.n }

// mix is murmur3's 64-bit finaliser of the seeded hash; its low bits are
// h's first probe position.
func (t *holderTable) mix(h kvevents.SeqHash) uint32 {
	x := uint64(h) ^ t.seed
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return uint32(x)
}

// find returns h's position and whether it is there; when not, the
// position is the empty entry where it would go. m is t.mix(h).
func (t *holderTable) find(h kvevents.SeqHash, m uint32) (uint64, bool) {
	i := uint64(m) & t.mask
	for {
		e := &t.e[i]
		if e.first.n == 0 {
			return i, false
		}
		if e.h == h {
			return i, true
		}
		i = (i + 1) & t.mask
	}
}

// holdersOf returns h's first holder and the further ones; ok is false when
// no worker holds h.
func (t *holderTable) holdersOf(h kvevents.SeqHash) (first holder, more []holder, ok bool) {
	i, ok := t.find(h, t.mix(h))
	if !ok {
		return holder{}, nil, false
	}
	e := &t.e[i]
	if e.more != 0 {
		more = t.lists[e.more-1]
	}
	return e.first, more, true
}

// holderTouch is how many home entries addAll and decAll load ahead in a
// tight loop of independent loads, so that the cache misses of a table
// larger than the cache overlap instead of queueing one per hash (the
// index's Lookup does the same).
const holderTouch = 16

// touch loads the home entries of hs (at most holderTouch) and returns
// their mixed hashes in ms.
func (t *holderTable) touch(hs []kvevents.SeqHash, ms *[holderTouch]uint32) {
	var sink uint64
	for i, h := range hs {
		m := t.mix(h)
		ms[i] = m
		sink += uint64(t.e[uint64(m)&t.mask].h)
	}
	t.sink += sink
}

// addAll is add for every hash of a booking's prompt; it returns how many
// became active on the worker.
func (t *holderTable) addAll(hs []kvevents.SeqHash, slot int32) int64 {
	return t.applyAll(hs, slot, true)
}

// decAll is dec for every hash of a booking's prompt; it returns how many
// left the worker.
func (t *holderTable) decAll(hs []kvevents.SeqHash, slot int32) int64 {
	return t.applyAll(hs, slot, false)
}

// applyAll is addAll (add) or decAll, chunk by touched chunk.
func (t *holderTable) applyAll(hs []kvevents.SeqHash, slot int32, add bool) (changed int64) {
	var ms [holderTouch]uint32
	for len(hs) > 0 {
		chunk := hs[:min(len(hs), holderTouch)]
		hs = hs[len(chunk):]
		t.touch(chunk, &ms)
		for i, h := range chunk {
			var c bool
			if add {
				c = t.add(h, ms[i], slot)
			} else {
				c = t.dec(h, ms[i], slot)
			}
			if c {
				changed++
			}
		}
	}
	return changed
}

// add counts one more booking on slot naming h (m = t.mix(h)); it reports
// whether h became active on that worker.
func (t *holderTable) add(h kvevents.SeqHash, m uint32, slot int32) bool {
	i, ok := t.find(h, m)
	if !ok {
		t.e[i] = holderEntry{h: h, first: holder{slot: slot, n: 1}, mix: m}
		t.n++
		if t.n*2 > len(t.e) {
			t.grow()
		}
		return true
	}
	e := &t.e[i]
	if e.first.slot == slot {
		e.first.n++
		return false
	}
	if e.more == 0 {
		e.more = t.newList()
	}
	l := &t.lists[e.more-1]
	for j := range *l {
		if (*l)[j].slot == slot {
			(*l)[j].n++
			return false
		}
	}
	*l = append(*l, holder{slot: slot, n: 1})
	return true
}

// dec undoes add (m = t.mix(h)); it reports whether h left the worker.
func (t *holderTable) dec(h kvevents.SeqHash, m uint32, slot int32) bool {
	i, ok := t.find(h, m)
	if !ok {
		return false
	}
	e := &t.e[i]
	if e.first.slot == slot {
		if e.first.n--; e.first.n > 0 {
			return false
		}
		if e.more == 0 {
			t.deleteAt(i)
			return true
		}
		l := &t.lists[e.more-1]
		last := len(*l) - 1
		e.first = (*l)[last]
		*l = (*l)[:last]
		t.dropListIfEmpty(e)
		return true
	}
	if e.more == 0 {
		return false
	}
	l := &t.lists[e.more-1]
	for j := range *l {
		if (*l)[j].slot != slot {
			continue
		}
		if (*l)[j].n--; (*l)[j].n > 0 {
			return false
		}
		last := len(*l) - 1
		(*l)[j] = (*l)[last]
		*l = (*l)[:last]
		t.dropListIfEmpty(e)
		return true
	}
	return false
}

func (t *holderTable) newList() int32 {
	if n := len(t.free); n > 0 {
		k := t.free[n-1]
		t.free = t.free[:n-1]
		return k + 1
	}
	t.lists = append(t.lists, nil)
	return int32(len(t.lists))
}

func (t *holderTable) dropListIfEmpty(e *holderEntry) {
	if len(t.lists[e.more-1]) > 0 {
		return
	}
	t.free = append(t.free, e.more-1)
	e.more = 0
}

// deleteAt empties entry i and moves later entries of its probe run back
// (backward-shift deletion: no tombstones, so lookups stay short).
func (t *holderTable) deleteAt(i uint64) {
	j := i
	for {
		j = (j + 1) & t.mask
		if t.e[j].first.n == 0 {
			break
		}
		k := uint64(t.e[j].mix) & t.mask
		// The entry at j may fill i unless its home lies cyclically in (i, j].
		if i <= j && i < k && k <= j || i > j && (i < k || k <= j) {
			continue
		}
		t.e[i] = t.e[j]
		i = j
	}
	t.e[i] = holderEntry{}
	t.n--
}

// grow doubles the array and re-inserts every entry.
func (t *holderTable) grow() {
	old := t.e
	t.e = make([]holderEntry, len(old)*2)
	t.mask = uint64(len(t.e) - 1)
	for _, e := range old {
		if e.first.n == 0 {
			continue
		}
		i := uint64(e.mix) & t.mask
		for t.e[i].first.n != 0 {
			i = (i + 1) & t.mask
		}
		t.e[i] = e
	}
}
