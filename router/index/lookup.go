package index

import (
	"math/bits"
	"slices"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// LookupOptions tune one Lookup.
type LookupOptions struct {
	// EarlyExit stops the scan once a single worker remains: that worker
	// is the best match, and its Blocks (and Total) are then a lower bound
	// (Overlaps.EarlyExited is set).
	EarlyExit bool
	// Allowed, when not nil, skips workers for which it returns false.
	// It is called at most once per worker holding the first block, or
	// twice when the lookup ran while a new worker took its first block
	// (see Index.Lookup).
	Allowed func(workerref.Target) bool
}

// WorkerOverlap is one worker's match: the number of contiguous leading
// blocks of the request it holds.
type WorkerOverlap struct {
	Key    workerref.Target
	Blocks int
}

// Overlaps receives lookup results. It is owned by the caller and reused
// across lookups: after the first few lookups of a given size, a Lookup
// allocates nothing. The zero value is ready to use; it is not safe for
// concurrent use.
type Overlaps struct {
	// Workers lists every worker holding at least the first block, with
	// the number of contiguous leading blocks it holds, in no particular
	// order.
	Workers []WorkerOverlap
	// Total is the longest match, in blocks.
	Total int
	// EarlyExited reports that LookupOptions.EarlyExit cut the scan.
	EarlyExited bool

	// parallel to Workers while a tracked lookup runs (track): each
	// entry's slot, for the final reuse check.
	seen  []uint32
	track bool

	// candidate state: a list (few workers) or a bitmap over slots.
	cand   []cand
	tmp    []cand
	bits   []uint64
	nbits  int
	bitmap bool
	sbuf   []uint32
	sink   uint64 // folds look-ahead loads so they are not elided
}

type cand struct {
	slot uint32
	info *slotInfo
}

// Reset empties o, keeping its memory.
func (o *Overlaps) Reset() {
	o.Workers = o.Workers[:0]
	o.Total = 0
	o.EarlyExited = false
	o.seen = o.seen[:0]
	o.cand = o.cand[:0]
	o.bitmap = false
	o.nbits = 0
}

// Get returns the overlap of k (0 when absent). Linear in len(Workers).
func (o *Overlaps) Get(k workerref.Target) int {
	for i := range o.Workers {
		if o.Workers[i].Key == k {
			return o.Workers[i].Blocks
		}
	}
	return 0
}

// listMax is the candidate count under which the bitmap representation is
// abandoned for a list.
const listMax = 16

// touchBatch is how many blocks Lookup touches ahead at once: a tight
// loop of independent loads, so that the cache misses of a large index
// overlap. Touching one block a few steps ahead inside the scan overlapped
// only about two: a step waiting on its miss fills the CPU's reorder
// window before the touches further ahead are issued. A new batch is
// touched when half of the previous one is scanned; a scan that stops
// early wastes at most one batch of loads.
const touchBatch = 16

// touchRing is the size of Lookup's ring of mixed hashes (a power of two
// above the touched blocks not yet scanned, at most 1.5 batches).
const touchRing = 2 * touchBatch

// Lookup computes, for every (worker, rank), how many leading blocks of
// hashes it holds, into out (reset first). It runs on the caller's
// goroutine without locks, concurrently with other lookups and with event
// application; it sees every change completed before it started and may
// or may not see changes made while it runs.
//
// Cost: one table probe per block until no candidate is left (or one is
// left, with EarlyExit), plus work proportional to the candidates: a merge
// of the sorted candidate list with the block's set while few workers
// remain, one AND per 64 slots per block while many do, and one result
// entry per matching worker.
func (x *Index) Lookup(hashes []kvevents.SeqHash, opt LookupOptions, out *Overlaps) {
	x.lookup(hashes, opt, out, false)
}

// lookup is Lookup; nested says that the index's sets nest along every
// prompt (see bisect), so that once few candidates are left their depths
// can be found by bisection instead of block by block.
//
// A slot freed and handed to another worker during the scan would blend
// two owners' blocks. Such a handover is rare (a worker's first block
// after another's last), so the scan does not note each entry's slot: when
// a slot was assigned while it ran, it runs once more, noting them, and
// drops the entries whose slot changed hands. Not noting them saves a
// store per listed worker, a thousand for a system prompt.
func (x *Index) lookup(hashes []kvevents.SeqHash, opt LookupOptions, out *Overlaps, nested bool) {
	out.track = false
	if x.scan(hashes, opt, out, nested) {
		return
	}
	out.track = true
	x.scan(hashes, opt, out, nested)
	out.track = false
}

// scan is one pass of lookup. It reports false when a slot was assigned
// while it ran and out.track was off: its result may blend two owners.
func (x *Index) scan(hashes []kvevents.SeqHash, opt LookupOptions, out *Overlaps, nested bool) bool {
	out.Reset()
	if len(hashes) == 0 {
		return true
	}
	epoch := x.slotEpoch.Load()
	v, big, ok := x.get(hashes[0])
	if !ok {
		return true
	}
	x.initCands(v, big, opt, epoch, out)
	// mixed[d%touchRing] holds mix(hashes[d]) for the blocks touched
	// ahead, hashes[1:touched].
	var mixed [touchRing]uint64
	var sink uint64
	touched := 1
	depth := 1
	for ; depth < len(hashes); depth++ {
		n := len(out.cand)
		if out.bitmap {
			n = out.nbits
		}
		if n == 0 {
			break
		}
		if opt.EarlyExit && n == 1 {
			out.EarlyExited = true
			break
		}
		if nested && !out.bitmap {
			// Every candidate holds blocks 0 to depth-1.
			x.bisect(hashes, depth-1, len(hashes), out.cand, out)
			out.cand = out.cand[:0]
			break
		}
		if depth+touchBatch/2 >= touched && touched < len(hashes) {
			end := min(touched+touchBatch, len(hashes))
			for a := touched; a < end; a++ {
				m := mix(uint64(hashes[a]))
				mixed[a%touchRing] = m
				sink += x.shardOf(m).touch(m)
			}
			touched = end
		}
		m := mixed[depth%touchRing]
		v, big, ok = x.shardOf(m).get(uint64(hashes[depth]), m)
		if !ok {
			break
		}
		if out.bitmap {
			x.stepBitmap(v, big, depth, epoch, out)
		} else {
			stepList(v, big, depth, out)
		}
	}
	out.sink += sink
	// Whoever is left holds all depth blocks scanned.
	if out.bitmap {
		x.drainBitmap(depth, epoch, out)
	} else {
		for _, c := range out.cand {
			out.record(c.slot, c.info, depth)
		}
		out.cand = out.cand[:0]
	}
	if x.slotEpoch.Load() != epoch {
		if !out.track {
			return false
		}
		// Drop any entry whose slot changed hands. (No assignment
		// happened otherwise.)
		w := 0
		for i := range out.Workers {
			// An owner assigned before the lookup started is the one the
			// scan saw: a slot changes hands only by a new assignment,
			// which carries a later epoch.
			if info := x.info(out.seen[i]); info != nil && info.assignedAt <= epoch {
				out.Workers[w], out.seen[w] = out.Workers[i], out.seen[i]
				w++
			}
		}
		out.Workers, out.seen = out.Workers[:w], out.seen[:w]
	}
	if nested {
		for _, w := range out.Workers {
			out.Total = max(out.Total, w.Blocks)
		}
	} else if n := len(out.Workers); n > 0 {
		// Entries are recorded in scan order, so the last one matched
		// deepest.
		out.Total = out.Workers[n-1].Blocks
	}
	return true
}

// bisect records the depth of every candidate in cs, which all hold
// hashes[lo] and none of which holds hashes[hi] (when hi < len(hashes)),
// by bisection: a probe of the block halfway splits cs into the holders,
// whose depths lie above it, and the rest, whose depths lie below. That is
// about log2(hi-lo) probes per group of candidates ending at one depth,
// instead of one probe per block; it reorders cs.
//
// It is exact only for an index whose sets nest along every prompt: a
// worker holding a prompt's block holds all the blocks before it. The
// predicted index is one (Approx): each record names a prompt's leading
// blocks, and a block outlives every later block of its prompt. A record
// drained only in part (Approx.drain under a budget or a cap) can leave a
// gap below a later block for a while; across it a bisection credits more
// blocks than a scan would, blocks of the oldest or an expired record.
func (x *Index) bisect(hashes []kvevents.SeqHash, lo, hi int, cs []cand, out *Overlaps) {
	for len(cs) > 0 {
		if hi-lo == 1 {
			for _, c := range cs {
				out.record(c.slot, c.info, hi)
			}
			return
		}
		mid := lo + (hi-lo)/2
		v, big, ok := x.get(hashes[mid])
		k := len(cs) // cs[:k] do not hold hashes[mid], cs[k:] do
		if ok {
			for i := 0; i < k; {
				if holds(v, big, cs[i].slot) {
					k--
					cs[i], cs[k] = cs[k], cs[i]
				} else {
					i++
				}
			}
		}
		x.bisect(hashes, mid, hi, cs[k:], out)
		cs, hi = cs[:k], mid
	}
}

// holds reports whether the set of a table word (and its big set) has slot.
func holds(v uint64, big *bigSet, slot uint32) bool {
	if big == nil {
		return inlineHas(v, slot)
	}
	return big.has(slot)
}

func (x *Index) get(h kvevents.SeqHash) (uint64, *bigSet, bool) {
	m := mix(uint64(h))
	return x.shardOf(m).get(uint64(h), m)
}

func (o *Overlaps) record(slot uint32, info *slotInfo, blocks int) {
	o.Workers = append(o.Workers, WorkerOverlap{Key: info.key, Blocks: blocks})
	if o.track {
		o.seen = append(o.seen, slot)
	}
}

// usable resolves slot to its owner if the owner may take part in this
// lookup: assigned before the lookup started and allowed.
func (x *Index) usable(slot uint32, epoch uint64, opt *LookupOptions) *slotInfo {
	info := x.info(slot)
	if info == nil || info.assignedAt > epoch {
		return nil
	}
	if opt.Allowed != nil && !opt.Allowed(info.key) {
		return nil
	}
	return info
}

// initCands sets the candidates from the first block's set: a list sorted
// by slot, or a bitmap when the set is a large bitmap.
func (x *Index) initCands(v uint64, big *bigSet, opt LookupOptions, epoch uint64, out *Overlaps) {
	if big == nil {
		var buf [narrowCap]uint32
		for _, s := range inlineSlots(buf[:0], v) {
			if info := x.usable(s, epoch, &opt); info != nil {
				out.cand = append(out.cand, cand{s, info})
			}
		}
		sortCands(out.cand)
		return
	}
	if big.bits == nil || big.n <= listMax {
		out.sbuf = big.appendSlots(out.sbuf[:0])
		for _, s := range out.sbuf {
			if info := x.usable(s, epoch, &opt); info != nil {
				out.cand = append(out.cand, cand{s, info})
			}
		}
		return
	}
	out.bitmap = true
	out.bits = append(out.bits[:0], big.bits...)
	if opt.Allowed == nil {
		// Owners are checked when results are recorded.
		out.nbits = big.n
		return
	}
	n := 0
	for w, word := range out.bits {
		for rest := word; rest != 0; rest &= rest - 1 {
			s := uint32(w)*64 + uint32(bits.TrailingZeros64(rest))
			if x.usable(s, epoch, &opt) == nil {
				word &^= 1 << (s % 64)
			} else {
				n++
			}
		}
		out.bits[w] = word
	}
	out.nbits = n
	if n <= listMax {
		x.bitmapToList(epoch, out)
	}
}

// sortCands sorts a short candidate list by slot (insertion sort).
func sortCands(c []cand) {
	for i := 1; i < len(c); i++ {
		for j := i; j > 0 && c[j].slot < c[j-1].slot; j-- {
			c[j], c[j-1] = c[j-1], c[j]
		}
	}
}

// stepList keeps the candidates holding the block at index depth; the
// candidate list stays sorted by slot.
func stepList(v uint64, big *bigSet, depth int, out *Overlaps) {
	w := 0
	switch {
	case big == nil:
		f0, f1, f2, f3 := inlineFields(v)
		for _, c := range out.cand {
			if f := uint64(c.slot) + 1; f == f0 || f == f1 || f == f2 || f == f3 {
				out.cand[w] = c
				w++
			} else {
				out.record(c.slot, c.info, depth)
			}
		}
	case big.bits != nil:
		for _, c := range out.cand {
			if wd := int(c.slot / 64); wd < len(big.bits) && big.bits[wd]&(1<<(c.slot%64)) != 0 {
				out.cand[w] = c
				w++
			} else {
				out.record(c.slot, c.info, depth)
			}
		}
	default:
		// Both sorted: one merge pass.
		l, j := big.list, 0
		for _, c := range out.cand {
			for j < len(l) && l[j] < c.slot {
				j++
			}
			if j < len(l) && l[j] == c.slot {
				out.cand[w] = c
				w++
			} else {
				out.record(c.slot, c.info, depth)
			}
		}
	}
	out.cand = out.cand[:w]
}

// stepBitmap intersects the candidate bitmap with the block's set.
func (x *Index) stepBitmap(v uint64, big *bigSet, depth int, epoch uint64, out *Overlaps) {
	if big != nil && big.bits != nil {
		bb := big.bits
		n := out.nbits
		for w, c := range out.bits {
			if c == 0 {
				continue
			}
			var m uint64
			if w < len(bb) {
				m = bb[w]
			}
			for d := c &^ m; d != 0; d &= d - 1 {
				x.recordSlot(uint32(w)*64+uint32(bits.TrailingZeros64(d)), depth, epoch, out)
				n--
			}
			out.bits[w] = c & m
		}
		out.nbits = n
		if n <= listMax {
			x.bitmapToList(epoch, out)
		}
		return
	}
	// A small set: the survivors are its members that are candidates.
	out.sbuf = out.sbuf[:0]
	if big == nil {
		out.sbuf = inlineSlots(out.sbuf, v)
	} else {
		out.sbuf = big.appendSlots(out.sbuf)
	}
	out.tmp = out.tmp[:0]
	for _, s := range out.sbuf {
		w := int(s / 64)
		if w < len(out.bits) && out.bits[w]&(1<<(s%64)) != 0 {
			out.bits[w] &^= 1 << (s % 64)
			if info := x.info(s); info != nil && info.assignedAt <= epoch {
				out.tmp = append(out.tmp, cand{s, info})
			}
		}
	}
	// Every candidate still in the bitmap dropped out here.
	x.drainBitmap(depth, epoch, out)
	out.cand = append(out.cand[:0], out.tmp...)
	sortCands(out.cand)
}

func (x *Index) recordSlot(s uint32, depth int, epoch uint64, out *Overlaps) {
	if info := x.info(s); info != nil && info.assignedAt <= epoch {
		out.record(s, info, depth)
	}
}

// drainBitmap records every candidate left in the bitmap at depth and
// switches to list mode with an empty list.
//
// It may record a thousand workers, so it works on local slice headers
// and reads the slot table once: loaded after the block sets that named
// these slots, it holds every owner those sets imply (allocSlot publishes
// an owner before any of its blocks).
func (x *Index) drainBitmap(depth int, epoch uint64, out *Overlaps) {
	if out.track {
		x.drainBitmapTracked(depth, epoch, out)
		return
	}
	owners := x.slots.Load().p
	n := 0
	for _, word := range out.bits {
		n += bits.OnesCount64(word)
	}
	// Written by index into slices sized for every candidate: the loop
	// below runs once per holder, and without append's checks it runs
	// about a quarter fewer instructions (cachegrind).
	i := len(out.Workers)
	ws := slices.Grow(out.Workers, n)[:i+n]
	for w, word := range out.bits {
		if word == 0 {
			continue
		}
		out.bits[w] = 0
		base := uint32(w) * 64
		if int(base)+64 > len(owners) {
			word &= 1<<max(0, len(owners)-int(base)) - 1 // slots past the table have no owner
		}
		for ; word != 0; word &= word - 1 {
			s := base + uint32(bits.TrailingZeros64(word))
			if info := owners[s].Load(); info != nil && info.assignedAt <= epoch {
				ws[i] = WorkerOverlap{Key: info.key, Blocks: depth}
				i++
			}
		}
	}
	out.Workers = ws[:i]
	out.bitmap = false
	out.nbits = 0
	out.cand = out.cand[:0]
}

// drainBitmapTracked is drainBitmap for a tracked pass, which notes each
// entry's slot.
func (x *Index) drainBitmapTracked(depth int, epoch uint64, out *Overlaps) {
	for w, word := range out.bits {
		out.bits[w] = 0
		for ; word != 0; word &= word - 1 {
			x.recordSlot(uint32(w)*64+uint32(bits.TrailingZeros64(word)), depth, epoch, out)
		}
	}
	out.bitmap = false
	out.nbits = 0
	out.cand = out.cand[:0]
}

func (x *Index) bitmapToList(epoch uint64, out *Overlaps) {
	out.cand = out.cand[:0]
	for w, word := range out.bits {
		for ; word != 0; word &= word - 1 {
			s := uint32(w)*64 + uint32(bits.TrailingZeros64(word))
			if info := x.info(s); info != nil && info.assignedAt <= epoch {
				out.cand = append(out.cand, cand{s, info})
			}
		}
		out.bits[w] = 0
	}
	out.bitmap = false
	out.nbits = 0
}

// cmpKey orders targets by worker, then rank (Stats' dumps).
func cmpKey(a, b workerref.Target) int {
	if a.Worker != b.Worker {
		if a.Worker < b.Worker {
			return -1
		}
		return 1
	}
	switch {
	case a.Rank < b.Rank:
		return -1
	case a.Rank > b.Rank:
		return 1
	}
	return 0
}
