package index

import (
	"slices"
	"sync/atomic"
	"unsafe"
)

// The block table maps a sequence hash to the set of worker slots holding
// it. It is split into shards; each shard is an open-addressing table with
// linear probing, read without any lock or retry loop. Writers (serialised
// by Index.wmu) keep three rules that make every single-word read
// consistent on its own:
//
//  1. Within one table, a bucket's key never changes once written. An
//     insert stores the key, then the value (0 = empty bucket), so a
//     reader that sees a value sees its key.
//  2. A block whose last worker leaves is not removed but marked dead (one
//     store of deadVal); it is revived in place if stored again. Nothing
//     moves, so a probe never misses an entry because of a concurrent
//     delete (backward-shift deletion would need a seqlock: two fenced
//     stores per delete plus the moves, which measured as a third of the
//     write path's cost).
//  3. Dead entries are purged when the table is rebuilt (grown, shrunk or
//     cleaned once live plus dead entries pass 3/4 of the buckets): the new
//     table is filled with plain writes while unpublished and then
//     published with one atomic pointer store. The old table is never
//     written again, so a reader still probing it sees a consistent,
//     slightly older state, and the garbage collector frees it once no
//     reader holds it.
//
// Sets that do not fit a table word (the encoding below) live in immutable
// bigSets (copy on write) reached through the shard's big-set array; a
// bigSet records its block's key, so a reader that followed a stale index
// into a reused array slot notices and probes again.

// Value encoding of one table entry:
//
//	0                      empty bucket
//	deadVal                a block no worker holds any more (key kept)
//	bit 63 = 0, 62 = 0     inline set, wide: three 20-bit fields (bits
//	                       0-19, 20-39, 40-59), each slot+1, 0 = unused,
//	                       filled from field 0 up
//	bit 63 = 0, 62 = 1     inline set, narrow: four 15-bit fields (bits
//	                       0-14, 15-29, 30-44, 45-59), all four used, for
//	                       four workers whose slots are under 32,767
//	bit 63 = 1             big set: bits 0-31 index the big-set array
//
// The narrow form exists because a block shared by four workers is common
// (a prompt prefix on a handful of workers) and a big set costs a lookup
// three more dependent loads per block (array, set, list): on
// BenchmarkLookup/shared1000, whose last 120 blocks are held by four
// workers, that was half the scan (docs/benchmarks/index.md).
const (
	bigFlag    = uint64(1) << 63
	narrowFlag = uint64(1) << 62
	deadVal    = bigFlag | 0xffffffff // a big index never handed out
	fieldBits  = 20
	fieldMask  = uint64(1)<<fieldBits - 1
	inlineCap  = 3 // wide fields
	narrowBits = 15
	narrowMask = uint64(1)<<narrowBits - 1
	narrowCap  = 4

	// MaxSlots is the largest number of (worker, rank) keys one index can
	// hold at the same time (slot+1 must fit a 20-bit field).
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
	used int // non-empty buckets, live or dead; written under Index.wmu
	live int // buckets holding a set
}

// buildTable returns a table of capacity c (a power of two) filled with
// src's live entries. It writes a plain []uint64 and reinterprets it: the
// table is not reachable by readers until published, and the publishing
// atomic store orders these writes before any reader's loads.
func buildTable(c int, src *table) *table {
	words := make([]uint64, 2*c)
	mask := uint64(c - 1)
	n := 0
	if src != nil {
		for i := uint64(0); i <= src.mask; i++ {
			v := src.s[2*i+1].Load()
			if v == 0 || v == deadVal {
				continue
			}
			k := src.s[2*i].Load()
			j := mix(k) & mask
			for words[2*j+1] != 0 {
				j = (j + 1) & mask
			}
			words[2*j], words[2*j+1] = k, v
			n++
		}
	}
	s := unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(unsafe.SliceData(words))), len(words))
	return &table{mask: mask, s: s, used: n, live: n}
}

// capFor returns the capacity for n live entries: load at most 1/2 after a
// rebuild, so the next rebuild is at least cap/4 inserts or deaths away;
// roomy, at most 2/5, so a table churning at a steady size is rebuilt less
// often (each rebuild reads the whole table). A growing table doubles
// either way, so its load just after growth, on which IndexBytesPerEntry's
// bound rests, is 3/8 under both rules. The index is roomy only while
// every worker is sequence-keyed (Index.countKeying): their entries cost
// no engine map, so the headroom fits in the memory that map took.
func capFor(n int, roomy bool) int {
	c := minTableCap
	for (!roomy && c < 2*n) || (roomy && 2*c < 5*n) {
		c <<= 1
	}
	return c
}

// find probes for key: its value, or false when absent or dead. Safe
// against concurrent writers by the rules above; always terminates.
func (t *table) find(key, h uint64) (uint64, bool) {
	i := h & t.mask
	for n := uint64(0); n <= t.mask; n++ {
		v := t.s[2*i+1].Load()
		if v == 0 {
			return 0, false
		}
		if t.s[2*i].Load() == key {
			return v, v != deadVal
		}
		i = (i + 1) & t.mask
	}
	return 0, false
}

// slot returns the bucket holding key (live or dead), or the empty bucket
// where it would go (found=false). Writer only; the table is never full.
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
	tab  atomic.Pointer[table]
	bigs atomic.Pointer[bigArr]
	// Writer-only fields (Index.wmu held).
	freeBig []uint32 // free indices in bigs
	nbig    int      // live big sets
	bigMem  int      // bytes held by live big sets
	roomy   bool     // capFor's headroom rule
	_       [64 - 16 - 24 - 16 - 1]byte
}

func (sh *shard) init() {
	sh.tab.Store(buildTable(minTableCap, nil))
	sh.bigs.Store(&bigArr{})
}

// get returns the set stored for key: the inline value, or the big set.
// Lock-free and wait-free except for the rare retry after following a
// big-set index that was freed and reused meanwhile.
func (sh *shard) get(key, h uint64) (uint64, *bigSet, bool) {
	for {
		v, ok := sh.tab.Load().find(key, h)
		if !ok || v&bigFlag == 0 {
			return v, nil, ok
		}
		arr := sh.bigs.Load()
		if idx := uint32(v); int(idx) < len(arr.p) {
			if b := arr.p[idx].Load(); b != nil && b.key == key {
				return v, b, true
			}
		}
		// The set moved on since the value was read: read it again.
	}
}

// touch loads the bucket h maps to (see Index.storeChunk).
func (sh *shard) touch(h uint64) uint64 {
	t := sh.tab.Load()
	return t.s[2*(h&t.mask)+1].Load()
}

// inline helpers ------------------------------------------------------------

// inlineFields returns an inline value's four fields (slot+1 each, 0 =
// unused; a wide value's fourth is always 0).
func inlineFields(v uint64) (f0, f1, f2, f3 uint64) {
	w, m := uint64(fieldBits), fieldMask
	if v&narrowFlag != 0 {
		w, m = narrowBits, narrowMask
	}
	return v & m, (v >> w) & m, (v >> (2 * w)) & m, (v >> (3 * w)) & m
}

func inlineHas(v uint64, slot uint32) bool {
	f := uint64(slot) + 1
	f0, f1, f2, f3 := inlineFields(v)
	return f == f0 || f == f1 || f == f2 || f == f3
}

// inlineSlots appends the slots of an inline value to dst.
func inlineSlots(dst []uint32, v uint64) []uint32 {
	f0, f1, f2, f3 := inlineFields(v)
	for _, f := range [narrowCap]uint64{f0, f1, f2, f3} {
		if f == 0 {
			break
		}
		dst = append(dst, uint32(f-1))
	}
	return dst
}

// encodeInline returns the inline value of a set of at most four slots,
// or false when it needs a big set (more than four, or four with a slot
// too large for a narrow field). An empty set encodes as 0.
func encodeInline(slots []uint32) (uint64, bool) {
	switch {
	case len(slots) <= inlineCap:
		var v uint64
		for i, s := range slots {
			v |= (uint64(s) + 1) << (i * fieldBits)
		}
		return v, true
	case len(slots) == narrowCap:
		v := narrowFlag
		for i, s := range slots {
			if uint64(s)+1 > narrowMask {
				return 0, false
			}
			v |= (uint64(s) + 1) << (i * narrowBits)
		}
		return v, true
	}
	return 0, false
}

// writer operations (Index.wmu held) -----------------------------------------

// add puts slot into key's set and reports whether it was absent.
func (sh *shard) add(key, h uint64, slot uint32) bool {
	t := sh.tab.Load()
	i, found := t.slot(key, h)
	if !found {
		if (t.used+1)*4 > int(t.mask+1)*3 {
			t = sh.rebuild(capFor(t.live+1, sh.roomy))
			i, _ = t.slot(key, h)
		}
		t.s[2*i].Store(key)
		t.s[2*i+1].Store(uint64(slot) + 1)
		t.used++
		t.live++
		return true
	}
	v := t.s[2*i+1].Load()
	if v == deadVal {
		t.s[2*i+1].Store(uint64(slot) + 1)
		t.live++
		return true
	}
	if v&bigFlag == 0 {
		if inlineHas(v, slot) {
			return false
		}
		var buf [narrowCap + 1]uint32
		slots := append(inlineSlots(buf[:0], v), slot)
		if nv, ok := encodeInline(slots); ok {
			t.s[2*i+1].Store(nv)
			return true
		}
		b := newBigSet(key, slots)
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
	if v == deadVal {
		return false
	}
	if v&bigFlag == 0 {
		if !inlineHas(v, slot) {
			return false
		}
		var buf [narrowCap]uint32
		nv, _ := encodeInline(slices.DeleteFunc(inlineSlots(buf[:0], v), func(s uint32) bool { return s == slot }))
		if nv == 0 {
			nv = deadVal
			t.live--
		}
		t.s[2*i+1].Store(nv)
		if c := int(t.mask + 1); c > minTableCap && t.live*8 < c {
			sh.rebuild(capFor(t.live, sh.roomy))
		}
		return true
	}
	idx := uint32(v)
	arr := sh.bigs.Load()
	old := arr.p[idx].Load()
	if !old.has(slot) {
		return false
	}
	nb := old.without(slot)
	var nv uint64
	inline := false
	if nb.n <= narrowCap {
		var buf [narrowCap]uint32
		nv, inline = encodeInline(nb.appendSlots(buf[:0]))
	}
	if !inline {
		sh.bigMem += nb.bytes() - old.bytes()
		arr.p[idx].Store(nb)
		return true
	}
	// Back to inline: publish the inline value first, then free the index;
	// a reader still holding the old value finds nil or another key's set
	// there and probes again.
	t.s[2*i+1].Store(nv)
	sh.freeBigAt(idx, old)
	return true
}

// rebuild publishes a new table of capacity c holding the live entries.
func (sh *shard) rebuild(c int) *table {
	nt := buildTable(c, sh.tab.Load())
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
	sh.bigMem -= old.bytes()
	sh.bigs.Load().p[idx].Store(nil)
	sh.freeBig = append(sh.freeBig, idx)
}

// appendKeysOf appends every live key whose set holds slot: forEach for
// one slot, without decoding the sets that do not hold it. Index.wmu held.
func (sh *shard) appendKeysOf(dst []uint64, slot uint32) []uint64 {
	t := sh.tab.Load()
	arr := sh.bigs.Load()
	for i := uint64(0); i <= t.mask; i++ {
		v := t.s[2*i+1].Load()
		switch {
		case v == 0 || v == deadVal:
			continue
		case v&bigFlag == 0:
			if !inlineHas(v, slot) {
				continue
			}
		case !arr.p[uint32(v)].Load().has(slot):
			continue
		}
		dst = append(dst, t.s[2*i].Load())
	}
	return dst
}

// forEach calls fn for every live key and its member slots. Index.wmu
// held by the caller (used by invariant checks and dumps).
func (sh *shard) forEach(fn func(key uint64, slots []uint32)) {
	t := sh.tab.Load()
	arr := sh.bigs.Load()
	var buf []uint32
	for i := uint64(0); i <= t.mask; i++ {
		v := t.s[2*i+1].Load()
		if v == 0 || v == deadVal {
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
