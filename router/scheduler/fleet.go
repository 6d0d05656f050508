package scheduler

import (
	"cmp"
	"slices"
	"time"
	"unsafe"

	"github.com/kvrouter/kvrouter/workerref"
)

// slot flags. A slot is one (worker, rank).
const (
	fLive        uint8 = 1 << iota // slot holds a registered (worker, rank)
	fAvail                         // registered and not draining
	fOverloaded                    // over an overload threshold: not a candidate
	fBusy                          // over a queue threshold (or overloaded)
	fDraining                      // not available, but serves the Hard sessions bound to it
	fPrefillOnly                   // RolePrefill: a candidate for prefill legs only
	fDecodeOnly                    // RoleDecode: not a candidate for prefill legs
	fRoles       = fPrefillOnly | fDecodeOnly
)

// eligibleMask/eligibleWant: a slot is a candidate when live, available and
// not overloaded (the allowed set is checked separately). drainingWant: a
// draining slot that is not overloaded is a candidate for a Hard
// requirement naming it, and only for that.
const (
	eligibleMask = fLive | fAvail | fOverloaded
	eligibleWant = fLive | fAvail
	freeMask     = fLive | fAvail | fBusy
	drainingMask = fLive | fAvail | fOverloaded | fDraining
	drainingWant = fLive | fDraining
)

// worker groups the ranks of one worker name.
type worker struct {
	name  string
	slots []int32 // one per registered rank, sorted by rank
}

// fleet is the per-(worker, rank) state, struct-of-arrays indexed by slot,
// so that a selection over thousands of workers walks dense arrays.
// Effective load = local + max(0, remote bookings + correction from load reports);
// the effective arrays are what selection reads.
type fleet struct {
	key        []workerref.Target
	wid        []int32 // index into workers
	flags      []uint8
	kvBlocks   []int64
	maxBatched []int64
	maxSeqs    []int32

	// effective load, read by selection
	prefill []int64
	decode  []int64
	active  []int32
	// the same as floats, so the hot cost loops skip the conversions
	prefillF []float64
	decodeF  []float64

	// load booked by this replica (l) and learned from other replicas (r)
	lPrefill []int64
	lDecode  []int64
	lActive  []int32
	rPrefill []int64
	rDecode  []int64
	rActive  []int32

	// corrections from load reports (>= −remote) and when they were made
	xPrefill []int64
	xDecode  []int64
	xActive  []int32
	xAt      []time.Time
	lastRep  []time.Time
	// waiting is the engine's own queue (requests admitted, not yet
	// running) from its last load report, expiring with the correction:
	// what a router that scrapes engine metrics scores (llm-d's queue
	// scorer). Bookings never change it.
	waiting []int32
	// routed is the prompt blocks this scheduler has routed to the slot
	// less each request's cached overlap there when routed: how SGLang's
	// per-worker approximate tree grows (by the text a request brings that
	// the worker does not hold; its eviction, past 67 M nodes, does not
	// happen at these scales). Never decreases; other replicas' routing is
	// not in it, as each SGLang gateway keeps its own tree.
	routed []int64

	freeSlots []int32
	order     []int32 // live slots sorted by (worker, rank): deterministic candidate order
	elig      []int32 // eligible slots in that order, rebuilt lazily when eligDirty
	eligDirty bool
	// roled counts the live slots with a role other than RoleBoth; while
	// it is 0 no request's candidates are narrowed by role and the
	// selection paths skip the role test. eligLeg are elig per leg (pd.go).
	roled   int
	eligLeg [numLegs][]int32

	workers   []worker
	freeWIDs  []int32
	byName    map[string]int32
	nonBusy   int            // live, available, not busy slots
	cache     []resolveEntry // open addressing, keyed by the name's address and the rank
	cacheMask uint64
	cacheUsed int
	hints     []resolveHint
}

// resolveHint remembers how the i-th overlap of the previous request
// resolved: the index reports workers in a stable order, so the same
// position usually names the same worker (same string memory) again. p
// points into the name's bytes, which keeps them alive: an equal pointer
// and length mean the same name. Hints are dropped on membership changes.
type resolveHint struct {
	p    *byte
	lr   uint32 // len(name)<<16 | rank (longer names or higher ranks get no hint)
	slot int32
}

// resolveEntry caches one (name address, rank) → slot. p keeps the name's
// bytes alive, so an equal address and length mean the same name.
type resolveEntry struct {
	p    *byte
	lr   uint32 // len(name)<<16 | rank; names or ranks >= 65536 are not cached
	slot int32
}

func newFleet() *fleet {
	f := &fleet{byName: make(map[string]int32)}
	f.resizeCache(0)
	return f
}

// resizeCache sizes the table to at least 4 entries per worker (two name
// copies per worker stay under half full) and empties it.
func (f *fleet) resizeCache(workers int) {
	n := 64
	for n < 4*workers {
		n <<= 1
	}
	if n != len(f.cache) {
		f.cache = make([]resolveEntry, n)
	} else {
		clear(f.cache)
	}
	f.cacheMask = uint64(n - 1)
	f.cacheUsed = 0
}

// slotOf returns the slot of k, or -1. The fast path is a cache keyed by the
// address of the worker-name bytes: the index hands out keys whose strings
// it stores once, so the same address comes back on every lookup and the
// name map (string hashing and comparing) is skipped.
func (f *fleet) slotOf(k workerref.Target) int32 {
	if len(k.Worker) == 0 {
		return -1
	}
	if len(k.Worker) >= 1<<16 || k.Rank >= 1<<16 {
		return f.lookup(k.Worker, k.Rank)
	}
	p := unsafe.StringData(k.Worker)
	lr := uint32(len(k.Worker))<<16 | k.Rank
	h := ((uint64(uintptr(unsafe.Pointer(p))) ^ uint64(k.Rank)<<40) * 0x9E3779B97F4A7C15) >> 24
	for {
		e := &f.cache[h&f.cacheMask]
		if e.p == p && e.lr == lr {
			return e.slot
		}
		if e.p == nil {
			s := f.lookup(k.Worker, k.Rank)
			if s < 0 {
				return s // misses are not cached: a later join must not find a stale one
			}
			if 2*(f.cacheUsed+1) > len(f.cache) {
				f.resizeCache(len(f.order)) // full of old addresses: start over
				return s
			}
			*e = resolveEntry{p: p, lr: lr, slot: s}
			f.cacheUsed++
			return s
		}
		h++
	}
}

// slotAtSlow resolves the i-th overlap key of a request when its
// positional hint (checked inline in prepare) does not match, and records
// the hint for next time.
func (f *fleet) slotAtSlow(i int, k workerref.Target) int32 {
	s := f.slotOf(k)
	if i >= max(1024, 2*len(f.order)) || len(k.Worker) >= 1<<16 || k.Rank >= 1<<16 {
		// past any sensible overlap list (one entry per worker): no hint,
		// so a malformed request cannot grow the hints without bound
		return s
	}
	for len(f.hints) <= i {
		f.hints = append(f.hints, resolveHint{lr: ^uint32(0)}) // matches nothing
	}
	f.hints[i] = resolveHint{p: unsafe.StringData(k.Worker), lr: uint32(len(k.Worker))<<16 | k.Rank, slot: s}
	return s
}

func (f *fleet) lookup(name string, rank uint32) int32 {
	w, ok := f.byName[name]
	if !ok {
		return -1
	}
	for _, s := range f.workers[w].slots {
		if f.key[s].Rank == rank {
			return s
		}
	}
	return -1
}

func (f *fleet) widOf(name string) int32 {
	w, ok := f.byName[name]
	if !ok {
		return -1
	}
	return w
}

// upsert registers or updates a (worker, rank); it reports whether the
// membership changed (new slot).
func (f *fleet) upsert(info WorkerInfo, th *Thresholds) (slot int32, added bool) {
	s := f.lookup(info.Key.Worker, info.Key.Rank)
	if s >= 0 && f.free(s) {
		f.nonBusy-- // refresh below counts it again if it stays free
	}
	if s < 0 {
		added = true
		s = f.newSlot()
		f.claimSlot(s, info.Key)
	}
	f.setRole(s, info.Role)
	f.flags[s] &^= fAvail | fDraining
	switch {
	case info.Available:
		f.flags[s] |= fAvail
	case info.Draining:
		f.flags[s] |= fDraining
	}
	f.kvBlocks[s] = int64(info.KVBlocks)
	f.maxBatched[s] = int64(info.MaxBatchedTokens)
	f.maxSeqs[s] = int32(info.MaxSeqs)
	if added {
		i, _ := slices.BinarySearchFunc(f.order, s, f.compareSlots)
		f.order = slices.Insert(f.order, i, s)
		f.membershipChanged(false)
	}
	f.flags[s] |= fBusy // not counted as free until refresh says so
	f.refresh(s, th)
	return s, added
}

// newSlot returns a free slot, reusing a released one before growing every
// column by one.
func (f *fleet) newSlot() int32 {
	if n := len(f.freeSlots); n > 0 {
		s := f.freeSlots[n-1]
		f.freeSlots = f.freeSlots[:n-1]
		return s
	}
	s := int32(len(f.key))
	f.key = append(f.key, workerref.Target{})
	f.wid = append(f.wid, 0)
	f.flags = append(f.flags, 0)
	f.kvBlocks = append(f.kvBlocks, 0)
	f.maxBatched = append(f.maxBatched, 0)
	f.maxSeqs = append(f.maxSeqs, 0)
	f.prefill = append(f.prefill, 0)
	f.prefillF = append(f.prefillF, 0)
	f.decodeF = append(f.decodeF, 0)
	f.decode = append(f.decode, 0)
	f.active = append(f.active, 0)
	f.lPrefill = append(f.lPrefill, 0)
	f.lDecode = append(f.lDecode, 0)
	f.lActive = append(f.lActive, 0)
	f.rPrefill = append(f.rPrefill, 0)
	f.rDecode = append(f.rDecode, 0)
	f.rActive = append(f.rActive, 0)
	f.xPrefill = append(f.xPrefill, 0)
	f.xDecode = append(f.xDecode, 0)
	f.xActive = append(f.xActive, 0)
	f.xAt = append(f.xAt, time.Time{})
	f.lastRep = append(f.lastRep, time.Time{})
	f.waiting = append(f.waiting, 0)
	f.routed = append(f.routed, 0)
	return s
}

// claimSlot gives slot s to key: its worker id (a new one for a worker not
// seen before), its place among the worker's ranks, and zeroed load.
func (f *fleet) claimSlot(s int32, key workerref.Target) {
	w, ok := f.byName[key.Worker]
	if !ok {
		if n := len(f.freeWIDs); n > 0 {
			w = f.freeWIDs[n-1]
			f.freeWIDs = f.freeWIDs[:n-1]
			f.workers[w] = worker{name: key.Worker}
		} else {
			w = int32(len(f.workers))
			f.workers = append(f.workers, worker{name: key.Worker})
		}
		f.byName[key.Worker] = w
	}
	ws := &f.workers[w]
	ws.slots = append(ws.slots, s)
	f.key[s] = key // before sorting: the comparison reads the new slot's rank
	slices.SortFunc(ws.slots, func(a, b int32) int { return cmp.Compare(f.key[a].Rank, f.key[b].Rank) })
	f.wid[s] = w
	f.flags[s] = fLive
	f.prefill[s], f.decode[s], f.active[s] = 0, 0, 0
	f.lPrefill[s], f.lDecode[s], f.lActive[s] = 0, 0, 0
	f.rPrefill[s], f.rDecode[s], f.rActive[s] = 0, 0, 0
	f.xPrefill[s], f.xDecode[s], f.xActive[s] = 0, 0, 0
	f.xAt[s], f.lastRep[s] = time.Time{}, time.Time{}
	f.waiting[s] = 0
	f.routed[s] = 0
}

// remove drops every rank of a worker and returns the freed slots.
func (f *fleet) remove(name string, freed []int32) []int32 {
	w, ok := f.byName[name]
	if !ok {
		return freed
	}
	for _, s := range f.workers[w].slots {
		if f.free(s) {
			f.nonBusy--
		}
		if f.flags[s]&fRoles != 0 {
			f.roled--
		}
		f.flags[s] = 0
		f.key[s] = workerref.Target{}
		f.freeSlots = append(f.freeSlots, s)
		freed = append(freed, s)
	}
	delete(f.byName, name)
	f.workers[w] = worker{}
	f.freeWIDs = append(f.freeWIDs, w)
	f.order = slices.DeleteFunc(f.order, func(s int32) bool { return f.flags[s]&fLive == 0 })
	f.membershipChanged(true)
	return freed
}

// membershipChanged keeps the key caches right: a departure may leave
// entries naming a slot that is now free or reused, so it empties them; a
// join cannot invalidate anything (misses are never cached), it only grows
// the table when the fleet outgrows it. Positional hints are dropped either
// way (they may hold misses).
func (f *fleet) membershipChanged(departed bool) {
	f.eligDirty = true
	f.hints = f.hints[:0]
	if departed || 4*len(f.order) > len(f.cache) {
		f.resizeCache(len(f.order))
	}
}

// compareSlots orders slots by (worker, rank): the candidate order.
func (f *fleet) compareSlots(a, b int32) int {
	if c := cmp.Compare(f.key[a].Worker, f.key[b].Worker); c != 0 {
		return c
	}
	return cmp.Compare(f.key[a].Rank, f.key[b].Rank)
}

// refresh recomputes a slot's effective load and its busy/overloaded flags
// under th, keeping nonBusy in step.
func (f *fleet) refresh(s int32, th *Thresholds) {
	wasFree := f.flags[s]&freeMask == fLive|fAvail
	wasElig := f.flags[s]&eligibleMask == eligibleWant
	// Local bookings count in full; remote bookings plus the report's
	// correction never below zero (a correction that cancelled remote
	// bookings must not go negative once they are freed).
	f.prefill[s] = f.lPrefill[s] + max(0, f.rPrefill[s]+f.xPrefill[s])
	f.decode[s] = f.lDecode[s] + max(0, f.rDecode[s]+f.xDecode[s])
	f.active[s] = f.lActive[s] + max(0, f.rActive[s]+f.xActive[s])
	f.prefillF[s], f.decodeF[s] = float64(f.prefill[s]), float64(f.decode[s])
	fl := f.flags[s] &^ (fOverloaded | fBusy)
	if fl&fLive != 0 {
		if over(f.prefill[s], f.maxBatched[s], th.OverloadPrefillFrac) || over(f.decode[s], f.kvBlocks[s], th.OverloadDecodeFrac) {
			fl |= fOverloaded | fBusy
		} else if over(f.prefill[s], f.maxBatched[s], th.QueuePrefillFrac) || over(f.decode[s], f.kvBlocks[s], th.QueueDecodeFrac) {
			fl |= fBusy
		}
	}
	f.flags[s] = fl
	if (fl&eligibleMask == eligibleWant) != wasElig {
		f.eligDirty = true
	}
	isFree := fl&freeMask == fLive|fAvail
	switch {
	case isFree && !wasFree:
		f.nonBusy++
	case !isFree && wasFree:
		f.nonBusy--
	}
}

// refreshAll recomputes every slot (after a threshold change).
func (f *fleet) refreshAll(th *Thresholds) {
	f.nonBusy = 0
	for s := range f.key {
		f.flags[s] |= fBusy // uncounted: refresh counts it if it is free
		f.refresh(int32(s), th)
	}
}

// over: load has reached frac × capacity. Off when frac or capacity is 0.
func over(load, capacity int64, frac float64) bool {
	return frac > 0 && capacity > 0 && float64(load) >= frac*float64(capacity)
}

// eligibleSlots is every eligible slot in (worker, rank) order: the
// candidate set of a request without an allowed set, kept between
// selections so that building it costs nothing while eligibility is stable.
func (f *fleet) eligibleSlots(leg Leg) []int32 {
	if f.eligDirty {
		f.elig = f.elig[:0]
		for _, s := range f.order {
			if f.flags[s]&eligibleMask == eligibleWant {
				f.elig = append(f.elig, s)
			}
		}
		if f.roled > 0 {
			f.splitByLeg()
		}
		f.eligDirty = false
	}
	if f.roled > 0 {
		return f.eligLeg[leg]
	}
	return f.elig
}

func (f *fleet) eligible(s int32) bool { return f.flags[s]&eligibleMask == eligibleWant }

// eligibleBound: eligible, or draining and not overloaded. It is the test
// for the rows of a Hard requirement's target: a draining worker keeps
// serving the sessions bound to it.
func (f *fleet) eligibleBound(s int32) bool {
	return f.eligible(s) || f.flags[s]&drainingMask == drainingWant
}
func (f *fleet) free(s int32) bool { return f.flags[s]&freeMask == fLive|fAvail }
func (f *fleet) schedulable(s int32) bool {
	return f.flags[s]&(fLive|fAvail) == fLive|fAvail
}

// resolvedTarget is a workerref.Target mapped onto the fleet: the worker id and, for a
// ranked target, the slot (-1 when that rank is not registered).
type resolvedTarget struct {
	wid     int32 // -1: worker unknown
	slot    int32 // ranked target's slot, -1 if not registered or worker-only
	hasRank bool
}

func (f *fleet) resolve(t workerref.Target) resolvedTarget {
	rt := resolvedTarget{wid: f.widOf(t.Worker), slot: -1, hasRank: !t.AnyRank}
	if rt.wid >= 0 && !t.AnyRank {
		rt.slot = f.lookup(t.Worker, t.Rank)
	}
	return rt
}

// slotsOf returns the slots a resolved target covers (none if unknown or
// its rank is out of range).
func (f *fleet) slotsOf(rt resolvedTarget, one *[1]int32) []int32 {
	if rt.wid < 0 {
		return nil
	}
	if rt.hasRank {
		if rt.slot < 0 {
			return nil
		}
		one[0] = rt.slot
		return one[:]
	}
	return f.workers[rt.wid].slots
}

// matches reports whether slot s is inside the resolved target.
func (rt *resolvedTarget) matches(f *fleet, s int32) bool {
	if rt.hasRank {
		return rt.slot == s
	}
	return rt.wid >= 0 && f.wid[s] == rt.wid
}
