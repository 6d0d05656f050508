package index

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// The block table maps a sequence hash to the set of worker slots holding
// it. It is split into shards; each shard is an open-addressing table with
// linear probing whose words are all read and written atomically, so a
// reader never takes a lock:
//
//   - inserts of a new key and updates of an inline set are single-word
//     stores that a reader sees either before or after (the key is stored
//     before the value, and an entry whose value is 0 is empty);
//   - deletions (backward-shift, which moves entries) and the freeing of a
//     big-set index bump the shard's seqlock counter around the change, so
//     a reader that overlapped them retries;
//   - growing or shrinking builds a new table and swaps one atomic pointer;
//     the old table is never written again, so a reader still probing it
//     sees a consistent (slightly older) state.
//
// Writers of one shard are serialised by the shard mutex. The counter and
// the table pointer sit on a different cache line from the mutex so that
// writers locking the shard do not invalidate the line readers poll.

// Value encoding of one table entry (0 = empty slot):
//
//	bit 63 = 0: inline set, three 21-bit fields (bits 0-20, 21-41, 42-62),
//	            each holding slot+1, 0 = unused, filled from field 0 up.
//	bit 63 = 1: big set; bits 0-31 index the shard's big-set array.
const (
	bigFlag   = uint64(1) << 63
	fieldBits = 21
	fieldMask = uint64(1)<<fieldBits - 1
	inlineCap = 3

	// MaxSlots is the largest number of (worker, rank) keys one index can
	// hold at the same time (slot+1 must fit a 21-bit field).
	MaxSlots = int(fieldMask) - 1

	minTableCap = 16
)

// mix is the splitmix64 finaliser. Sequence hashes are already XXH3 output,
// but tests and foreign producers may use small or structured values.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// table is one generation of a shard's open-addressing array: s[2i] is the
// key, s[2i+1] the value of bucket i.
type table struct {
	mask uint64
	s    []atomic.Uint64
	used int // occupied buckets; written only under the shard mutex
}

func newTable(capacity int) *table {
	c := minTableCap
	for c < capacity {
		c <<= 1
	}
	return &table{mask: uint64(c - 1), s: make([]atomic.Uint64, 2*c)}
}

// find probes for key. It is safe against concurrent writers: it always
// terminates, and its answer is validated by the caller's seqlock check.
func (t *table) find(key, h uint64) (uint64, bool) {
	i := h & t.mask
	for n := uint64(0); n <= t.mask; n++ {
		v := t.s[2*i+1].Load()
		if v == 0 {
			return 0, false
		}
		if t.s[2*i].Load() == key {
			return v, true
		}
		i = (i + 1) & t.mask
	}
	return 0, false
}

// slot returns the bucket holding key, or the empty bucket where it would
// go (found=false). Writer only; the table is never full.
func (t *table) slot(key, h uint64) (i uint64, found bool) {
	i = h & t.mask
	for {
		v := t.s[2*i+1].Load()
		if v == 0 {
			return i, false
		}
		if t.s[2*i].Load() == key {
			return i, true
		}
		i = (i + 1) & t.mask
	}
}

type bigArr struct {
	p []atomic.Pointer[bigSet]
}

type shard struct {
	seq  atomic.Uint64 // seqlock: odd while a writer moves or frees entries
	tab  atomic.Pointer[table]
	bigs atomic.Pointer[bigArr]
	_    [64 - 24]byte

	mu      sync.Mutex
	freeBig []uint32 // free indices in bigs, writer only
	nbig    int      // live big sets
	bigMem  int      // bytes held by live big sets
	_       [64 - 8 - 24 - 16]byte
}

func (sh *shard) init() {
	sh.tab.Store(newTable(minTableCap))
	sh.bigs.Store(&bigArr{})
}

// get returns the set stored for key: the inline value, or the big set.
// Lock-free; retries while a writer is moving entries.
func (sh *shard) get(key, h uint64) (v uint64, big *bigSet, ok bool) {
	for spins := 0; ; spins++ {
		s1 := sh.seq.Load()
		if s1&1 == 0 {
			t := sh.tab.Load()
			v, ok = t.find(key, h)
			big = nil
			if ok && v&bigFlag != 0 {
				arr := sh.bigs.Load()
				if idx := uint32(v); int(idx) < len(arr.p) {
					big = arr.p[idx].Load()
				}
			}
			if sh.seq.Load() == s1 {
				if ok && v&bigFlag != 0 && big == nil {
					// Cannot happen under the protocol; treat as absent
					// rather than trust a torn read.
					return 0, nil, false
				}
				return v, big, ok
			}
		}
		if spins > 8 {
			runtime.Gosched()
		}
	}
}

// touch loads the bucket h maps to (see Index.touchStores).
func (sh *shard) touch(h uint64) uint64 {
	t := sh.tab.Load()
	return t.s[2*(h&t.mask)+1].Load()
}

// inline helpers ------------------------------------------------------------

func inlineCount(v uint64) int {
	switch {
	case v&fieldMask == 0:
		return 0
	case (v>>fieldBits)&fieldMask == 0:
		return 1
	case (v>>(2*fieldBits))&fieldMask == 0:
		return 2
	}
	return 3
}

func inlineHas(v uint64, slot uint32) bool {
	f := uint64(slot) + 1
	return v&fieldMask == f || (v>>fieldBits)&fieldMask == f || (v>>(2*fieldBits))&fieldMask == f
}

// inlineSlots appends the slots of an inline value to dst.
func inlineSlots(dst []uint32, v uint64) []uint32 {
	for i := 0; i < inlineCap; i++ {
		f := (v >> (i * fieldBits)) & fieldMask
		if f == 0 {
			break
		}
		dst = append(dst, uint32(f-1))
	}
	return dst
}

// inlineWithout removes slot from v, keeping fields packed from field 0.
func inlineWithout(v uint64, slot uint32) uint64 {
	f := uint64(slot) + 1
	var out uint64
	n := 0
	for i := 0; i < inlineCap; i++ {
		g := (v >> (i * fieldBits)) & fieldMask
		if g == 0 {
			break
		}
		if g != f {
			out |= g << (n * fieldBits)
			n++
		}
	}
	return out
}

// writer operations (shard mutex held) ---------------------------------------

// add puts slot into key's set and reports whether it was absent.
func (sh *shard) add(key, h uint64, slot uint32) bool {
	t := sh.tab.Load()
	i, found := t.slot(key, h)
	if !found {
		if (t.used+1)*4 > int(t.mask+1)*3 {
			t = sh.resize(int(t.mask+1) * 2)
			i, _ = t.slot(key, h)
		}
		t.s[2*i].Store(key)
		t.s[2*i+1].Store(uint64(slot) + 1)
		t.used++
		return true
	}
	v := t.s[2*i+1].Load()
	if v&bigFlag == 0 {
		if inlineHas(v, slot) {
			return false
		}
		if n := inlineCount(v); n < inlineCap {
			t.s[2*i+1].Store(v | (uint64(slot)+1)<<(n*fieldBits))
			return true
		}
		var buf [inlineCap + 1]uint32
		members := append(inlineSlots(buf[:0], v), slot)
		b := newBigSet(members)
		idx := sh.allocBig(b)
		// The big set is reachable before the value names it.
		t.s[2*i+1].Store(bigFlag | uint64(idx))
		return true
	}
	idx := uint32(v)
	arr := sh.bigs.Load()
	old := arr.p[idx].Load()
	if old.has(slot) {
		return false
	}
	nb := old.with(slot)
	sh.bigMem += nb.bytes() - old.bytes()
	arr.p[idx].Store(nb) // same index: readers see the old or the new set
	return true
}

// remove takes slot out of key's set and reports whether it was present.
func (sh *shard) remove(key, h uint64, slot uint32) bool {
	t := sh.tab.Load()
	i, found := t.slot(key, h)
	if !found {
		return false
	}
	v := t.s[2*i+1].Load()
	if v&bigFlag == 0 {
		if !inlineHas(v, slot) {
			return false
		}
		if nv := inlineWithout(v, slot); nv != 0 {
			t.s[2*i+1].Store(nv)
			return true
		}
		sh.deleteAt(t, i)
		return true
	}
	idx := uint32(v)
	arr := sh.bigs.Load()
	old := arr.p[idx].Load()
	if !old.has(slot) {
		return false
	}
	nb := old.without(slot)
	if nb.n > inlineCap {
		sh.bigMem += nb.bytes() - old.bytes()
		arr.p[idx].Store(nb)
		return true
	}
	// Back to inline: the index is freed and may be reused by another key,
	// so readers that loaded the old value must retry.
	var buf [inlineCap]uint32
	var nv uint64
	for k, s := range nb.appendSlots(buf[:0]) {
		nv |= (uint64(s) + 1) << (k * fieldBits)
	}
	sh.seq.Add(1)
	t.s[2*i+1].Store(nv)
	sh.freeBigAt(idx, old)
	sh.seq.Add(1)
	return true
}

// deleteAt empties bucket i with backward-shift deletion inside a seqlock
// write section, then shrinks the table when it is mostly empty.
func (sh *shard) deleteAt(t *table, i uint64) {
	v := t.s[2*i+1].Load()
	sh.seq.Add(1)
	if v&bigFlag != 0 {
		sh.freeBigAt(uint32(v), sh.bigs.Load().p[uint32(v)].Load())
	}
	j := i
	for {
		j = (j + 1) & t.mask
		vj := t.s[2*j+1].Load()
		if vj == 0 {
			break
		}
		kj := t.s[2*j].Load()
		ideal := mix(kj) & t.mask
		// Entry j may fill the hole at i unless its ideal bucket lies
		// cyclically in (i, j].
		if i <= j {
			if i < ideal && ideal <= j {
				continue
			}
		} else if i < ideal || ideal <= j {
			continue
		}
		t.s[2*i].Store(kj)
		t.s[2*i+1].Store(vj)
		i = j
	}
	t.s[2*i+1].Store(0)
	t.s[2*i].Store(0)
	sh.seq.Add(1)
	t.used--
	if c := int(t.mask + 1); c > minTableCap && t.used*8 < c {
		sh.resize(c / 2)
	}
}

// resize rebuilds the table with capacity c and publishes it.
func (sh *shard) resize(c int) *table {
	old := sh.tab.Load()
	nt := newTable(c)
	for i := uint64(0); i <= old.mask; i++ {
		v := old.s[2*i+1].Load()
		if v == 0 {
			continue
		}
		k := old.s[2*i].Load()
		j, _ := nt.slot(k, mix(k))
		nt.s[2*j].Store(k)
		nt.s[2*j+1].Store(v)
	}
	nt.used = old.used
	sh.tab.Store(nt)
	return nt
}

func (sh *shard) allocBig(b *bigSet) uint32 {
	sh.nbig++
	sh.bigMem += b.bytes()
	arr := sh.bigs.Load()
	if n := len(sh.freeBig); n > 0 {
		idx := sh.freeBig[n-1]
		sh.freeBig = sh.freeBig[:n-1]
		arr.p[idx].Store(b)
		return idx
	}
	idx := uint32(len(arr.p))
	if idx >= uint32(cap(arr.p)) {
		na := &bigArr{p: make([]atomic.Pointer[bigSet], len(arr.p), 2*cap(arr.p)+8)}
		for k := range arr.p {
			na.p[k].Store(arr.p[k].Load())
		}
		na.p = na.p[:idx+1]
		na.p[idx].Store(b)
		sh.bigs.Store(na)
		return idx
	}
	// Room in the backing array: extend a copy of the header. Readers
	// holding the old header never index beyond its length.
	na := &bigArr{p: arr.p[:idx+1]}
	na.p[idx].Store(b)
	sh.bigs.Store(na)
	return idx
}

func (sh *shard) freeBigAt(idx uint32, old *bigSet) {
	sh.nbig--
	if old != nil {
		sh.bigMem -= old.bytes()
	}
	sh.bigs.Load().p[idx].Store(nil)
	sh.freeBig = append(sh.freeBig, idx)
}

// forEach calls fn for every key and its member slots. Writer lock held by
// the caller (used by invariant checks and dumps).
func (sh *shard) forEach(fn func(key uint64, slots []uint32)) {
	t := sh.tab.Load()
	arr := sh.bigs.Load()
	var buf []uint32
	for i := uint64(0); i <= t.mask; i++ {
		v := t.s[2*i+1].Load()
		if v == 0 {
			continue
		}
		buf = buf[:0]
		if v&bigFlag == 0 {
			buf = inlineSlots(buf, v)
		} else {
			buf = arr.p[uint32(v)].Load().appendSlots(buf)
		}
		fn(t.s[2*i].Load(), buf)
	}
}
