package scheduler

import (
	"math/bits"

	"github.com/kvrouter/kvrouter/workerref"
)

// Policy picks one worker from the candidates. The scheduler has already
// applied eligibility and the pin rule (so a Hard requirement never reaches
// a policy as anything but a narrowed candidate set); a Soft target arrives
// as Context.Affinity. Policies are pure: they must not keep per-request
// state or book anything (booking happens only in the queue), and they are
// called under the scheduler's lock, one call at a time, so a Policy shared by
// several schedulers must be safe for concurrent use (builtins are: they
// hold only configuration). Select returns an index into c (after any
// Retain the policy did), or an error wrapping ErrNoCandidate when nothing
// is left.
type Policy interface {
	Name() string
	Select(x *Context, c *Candidates) (int, error)
}

// Seeded is implemented by policies whose configuration carries a seed for
// reproducible picks; the scheduler seeds its random source from it unless
// Config has a seed.
type Seeded interface {
	Seed() (uint64, bool)
}

// OutputBlockTracker is implemented by a policy that says whether the load
// view books a request's expected output as decode blocks (kvrouter's
// accounting, and the answer for a policy that does not implement it) or
// only its prompt blocks, as Dynamo's router does unless told to track
// output blocks. The scheduler asks once, at New, and books every request
// it places accordingly.
type OutputBlockTracker interface {
	TracksOutputBlocks() bool
}

// BookedPrefixCounter is implemented by a policy that says whether a
// prompt prefix that active bookings on a worker name counts as cached
// there (the default policy's view) or only what the indexes hold (the
// answer for a policy that does not implement it). A booked prefix is
// being computed or already is; the event index hears of it only when the
// engine's events arrive, and the predicted index a moment after the route
// (it is fed off the request path). Siblings of a burst arriving within
// that moment would otherwise each find no holder and scatter, computing
// the new prefix once per worker. Only this scheduler's own bookings name
// their blocks (other replicas' arrive as counts); their decisions reach
// this replica's predicted index by decision sync. The scheduler asks
// once, at New.
type BookedPrefixCounter interface {
	CountsBookedPrefix() bool
}

// Filter drops candidates: keep[i] starts true for every candidate and the
// filter sets it false for those it rejects.
type Filter interface {
	Filter(x *Context, c *Candidates, keep []bool)
}

// Scorer writes a finite cost per candidate into cost[:c.Len()]; lower is
// better.
type Scorer interface {
	Score(x *Context, c *Candidates, cost []float64)
}

// Picker chooses a candidate from the weighted sum of the scorers' costs.
type Picker interface {
	Pick(x *Context, c *Candidates, cost []float64) (int, error)
}

// Context is what a policy knows about the request being placed, plus a
// random source and scratch space owned by the scheduler.
type Context struct {
	Request       *Request
	BlockSize     int
	RequestBlocks int    // prompt blocks with a sequence hash (full blocks)
	PromptTokens  int    // ISL
	Seq           uint64 // selections of this request's leg made by this scheduler so far (round robin)
	// CachedShare is the share of the prompt blocks this scheduler routed
	// lately that the chosen worker already held (0..1; 1 before the
	// first selection): the fleet's recent hit ratio as the router sees
	// it, averaged over about the last 256 selections (cachedshare.go).
	CachedShare float64
	// HeldShare is the share of this scheduler's recent selections whose
	// request had first waited in its admission queue because every worker
	// it could use was busy (0..1; 0 before the first), over about the
	// last 256 selections (cachedshare.go).
	HeldShare float64

	held   bool // this selection's request waited in the queue
	aff    workerref.Target
	hasAff bool
	rng    *rng
	invBS  float64 // 1 / BlockSize

	// pairW is e^(−1/pairT), the costlier row's softmax weight when
	// sampling between two workers at temperature pairT (samplePairPlain).
	pairT, pairW float64

	costBuf, tmpBuf, userBuf []float64
	boolBuf                  []bool
}

func (x *Context) invBlockSize() float64 {
	if x.invBS == 0 {
		x.invBS = 1 / float64(max(1, x.BlockSize))
	}
	return x.invBS
}

// Affinity returns the Soft target for this request, if any: a Soft session
// binding, an explicit wire preference, or a classifier's suggestion.
func (x *Context) Affinity() (workerref.Target, bool) { return x.aff, x.hasAff }

// Uint64 returns a random number from the scheduler's (optionally seeded)
// source.
func (x *Context) Uint64() uint64 { return x.rng.next() }

// IntN returns a uniform random int in [0, n); n must be > 0.
func (x *Context) IntN(n int) int { return x.rng.intn(n) }

// Float64 returns a uniform random float in [0, 1).
func (x *Context) Float64() float64 { return x.rng.float64() }

// Scratch returns a float64 slice of length n (contents undefined) that is
// valid until Select returns, for a custom policy, filter, scorer or picker;
// no builtin uses it. Repeated calls return the same memory.
func (x *Context) Scratch(n int) []float64 { return resize(&x.userBuf, n) }

func (x *Context) costs(n int) []float64 { return resize(&x.costBuf, n) }
func (x *Context) tmp(n int) []float64   { return resize(&x.tmpBuf, n) }
func (x *Context) bools(n int) []bool    { return resize(&x.boolBuf, n) }

// resize returns *buf cut to length n (contents undefined), reallocating
// with a quarter's headroom only when it is too small, so selections over a
// steady fleet reuse one allocation per buffer.
func resize[T any](buf *[]T, n int) []T {
	if cap(*buf) < n {
		*buf = make([]T, n, n+n/4)
	}
	*buf = (*buf)[:n]
	return *buf
}

// Candidates is the set a policy chooses from, in (worker, rank) order. Its
// accessors read the scheduler's struct-of-arrays load view through the
// candidate's slot; the request-specific values (overlap, potential decode
// blocks) are folded in.
type Candidates struct {
	slots     []int32 // candidate slots; may alias the fleet's eligible list until Retain
	owned     bool    // slots is our scratch (safe to compact)
	own       []int32 // scratch backing for owned slots
	f         *fleet
	prefill   []int64 // the fleet's arrays, copied here so accessors skip a hop
	decode    []int64
	active    []int32
	prefillF  []float64
	decodeF   []float64
	ov        []uint64 // by slot: epoch | overlap blocks (stale epoch = 0 blocks)
	rep       []uint64 // by slot: epoch | of those, the blocks the engines' events report
	epoch     uint64   // current selection's epoch, in the high 32 bits
	shared    []int32  // by slot: request blocks already active there
	anyShared bool     // some slot has shared > 0
	newBlks   int64    // request decode blocks if nothing were shared
	aff       resolvedTarget
	hasAff    bool

	// warm: by slot, the epoch when the slot holds the request's adapter
	// (adapters.go); adapter: the request names one; anyAdapter: some
	// candidate holds it (the adapter term is on).
	warm                []uint64
	adapter, anyAdapter bool
}

// ovAt is the overlap of slot s for the current request.
func (c *Candidates) ovAt(s int32) int32 {
	if v := c.ov[s]; v >= c.epoch {
		return int32(uint32(v))
	}
	return 0
}

// ReportedBlocks is how many of candidate i's overlap blocks the engines'
// own events report (Overlap.Reported).
func (c *Candidates) ReportedBlocks(i int) int {
	if v := c.rep[c.slots[i]]; v >= c.epoch {
		return int(uint32(v))
	}
	return 0
}

// Len is the number of candidates.
func (c *Candidates) Len() int { return len(c.slots) }

// Key is the (worker, rank) of candidate i.
func (c *Candidates) Key(i int) workerref.Target { return c.f.key[c.slots[i]] }

// OverlapBlocks is how many leading prompt blocks candidate i has cached.
func (c *Candidates) OverlapBlocks(i int) int { return int(c.ovAt(c.slots[i])) }

// ActivePrefillTokens is the prefill work booked on candidate i (tokens).
func (c *Candidates) ActivePrefillTokens(i int) int { return int(c.prefill[c.slots[i]]) }

// ActiveDecodeBlocks is the decode blocks booked on candidate i.
func (c *Candidates) ActiveDecodeBlocks(i int) int { return int(c.decode[c.slots[i]]) }

// PotentialDecodeBlocks is candidate i's decode blocks if this request were
// added: its booked blocks plus the request's blocks, with the prompt
// blocks already active there counted once.
func (c *Candidates) PotentialDecodeBlocks(i int) int {
	s := c.slots[i]
	return int(c.decode[s] + c.newBlks - int64(c.shared[s]))
}

// ActiveRequests is the number of requests booked on candidate i.
func (c *Candidates) ActiveRequests(i int) int { return int(c.active[c.slots[i]]) }

// WaitingRequests is candidate i's engine queue as its last load report
// gave it (0 without a live report): the engine's own count, which
// bookings do not change.
func (c *Candidates) WaitingRequests(i int) int { return int(c.f.waiting[c.slots[i]]) }

// RoutedBlocks is how many blocks this scheduler has routed to candidate
// i that its cache did not hold then (see fleet.routed).
func (c *Candidates) RoutedBlocks(i int) int { return int(c.f.routed[c.slots[i]]) }

// KVBlocks is candidate i's KV capacity in blocks (0 = unknown).
func (c *Candidates) KVBlocks(i int) int { return int(c.f.kvBlocks[c.slots[i]]) }

// MaxBatchedTokens is candidate i's batch budget in tokens (0 = unknown).
func (c *Candidates) MaxBatchedTokens(i int) int { return int(c.f.maxBatched[c.slots[i]]) }

// MaxSeqs is candidate i's concurrent-sequence limit (0 = unknown).
func (c *Candidates) MaxSeqs(i int) int { return int(c.f.maxSeqs[c.slots[i]]) }

// Busy reports whether candidate i is over a queue threshold (it is still a
// candidate: only overloaded workers are not).
func (c *Candidates) Busy(i int) bool { return c.f.flags[c.slots[i]]&fBusy != 0 }

// IsAffinityTarget reports whether candidate i is inside the Soft target.
func (c *Candidates) IsAffinityTarget(i int) bool {
	return c.hasAff && c.aff.matches(c.f, c.slots[i])
}

// anyAffinityTarget reports whether the Soft target is among the candidates.
func (c *Candidates) anyAffinityTarget() bool {
	if !c.hasAff {
		return false
	}
	for _, s := range c.slots {
		if c.aff.matches(c.f, s) {
			return true
		}
	}
	return false
}

// Retain keeps the candidates whose keep flag is set, in order; len(keep)
// must be Len().
func (c *Candidates) Retain(keep []bool) {
	keep = keep[:len(c.slots)]
	first := 0
	for first < len(keep) && keep[first] {
		first++
	}
	if first == len(keep) {
		return // all kept: nothing to copy
	}
	if !c.owned {
		c.own = append(c.own[:0], c.slots...)
		c.slots, c.owned = c.own, true
	}
	j := first
	for i := first + 1; i < len(keep); i++ {
		if keep[i] {
			c.slots[j] = c.slots[i]
			j++
		}
	}
	c.slots = c.slots[:j]
}

// CandidateRow is one worker in a hand-built candidate set (NewCandidates).
type CandidateRow struct {
	Key                 workerref.Target
	OverlapBlocks       int
	ReportedBlocks      int // of OverlapBlocks, reported by the engines' events
	ActivePrefillTokens int
	ActiveDecodeBlocks  int // booked; PotentialDecodeBlocks adds RequestBlocks
	ActiveRequests      int
	KVBlocks            int
	MaxBatchedTokens    int
	SharedBlocks        int  // request blocks already active there
	WaitingRequests     int  // the engine's queue, as a load report gives it
	RoutedBlocks        int  // blocks routed there that its cache did not hold
	AdapterResident     bool // holds the request's adapter (Request.Adapter)
}

// NewCandidates builds a standalone candidate set and context for testing a
// policy outside a scheduler. requestBlocks is the request's decode blocks
// (PotentialDecodeBlocks = ActiveDecodeBlocks + requestBlocks − SharedBlocks);
// aff, when non-nil, is the Soft target. The context's CachedShare is 1 (no
// history); set it to test a policy that reads it.
func NewCandidates(r *Request, blockSize, requestBlocks int, seed uint64, aff *workerref.Target, rows []CandidateRow) (*Context, *Candidates) {
	f := newFleet()
	c := &Candidates{f: f, newBlks: int64(requestBlocks), epoch: 1 << 32, owned: true}
	for _, row := range rows {
		s, _ := f.upsert(WorkerInfo{Key: row.Key, KVBlocks: row.KVBlocks, MaxBatchedTokens: row.MaxBatchedTokens, Available: true}, &Thresholds{})
		f.prefill[s] = int64(row.ActivePrefillTokens)
		f.decode[s] = int64(row.ActiveDecodeBlocks)
		f.active[s] = int32(row.ActiveRequests)
		f.waiting[s] = int32(row.WaitingRequests)
		f.routed[s] = int64(row.RoutedBlocks)
		for len(c.shared) <= int(s) {
			c.shared = append(c.shared, 0)
			c.ov = append(c.ov, 0)
			c.rep = append(c.rep, 0)
			c.warm = append(c.warm, 0)
		}
		if r != nil && r.Adapter != "" && row.AdapterResident {
			c.warm[s] = c.epoch
			c.anyAdapter = true
		}
		c.ov[s] = c.epoch | uint64(uint32(row.OverlapBlocks))
		c.rep[s] = c.epoch | uint64(uint32(min(row.ReportedBlocks, row.OverlapBlocks)))
		c.shared[s] = int32(row.SharedBlocks)
		c.anyShared = c.anyShared || row.SharedBlocks > 0
		c.slots = append(c.slots, s)
	}
	for _, s := range c.slots {
		f.prefillF[s], f.decodeF[s] = float64(f.prefill[s]), float64(f.decode[s])
	}
	c.prefill, c.decode, c.active = f.prefill, f.decode, f.active
	c.prefillF, c.decodeF = f.prefillF, f.decodeF
	if r == nil {
		r = &Request{}
	}
	c.adapter = r.Adapter != ""
	x := &Context{Request: r, BlockSize: blockSize, RequestBlocks: len(r.SeqHashes), PromptTokens: r.Tokens, CachedShare: 1,
		rng: newRNG(seed)}
	if aff != nil {
		x.aff, x.hasAff = *aff, true
		c.aff, c.hasAff = f.resolve(*aff), true
	}
	return x, c
}

// rng is wyrand: tiny, fast, good enough for tie-breaks and sampling.
type rng struct{ s uint64 }

func newRNG(seed uint64) *rng { return &rng{s: seed} }

func (r *rng) next() uint64 {
	r.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(r.s, r.s^0xe7037ed1a0b428db)
	return hi ^ lo
}

// intn: Lemire's multiply-shift (bias is < n/2^64, irrelevant here).
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}

// keepTied is one step of reservoir sampling over the rows tied at the
// lowest cost: the k-th tied row replaces the kept one with probability 1/k,
// so each of the k is the final pick with probability 1/k. It returns the
// kept row and the new tie count, and is the one tie-break every minimum
// search uses (the same draws on every path).
func (r *rng) keepTied(kept, row, ties int) (int, int) {
	ties++
	if r.intn(ties) == 0 {
		return row, ties
	}
	return kept, ties
}

func (r *rng) float64() float64 { return float64(r.next()>>11) * (1.0 / (1 << 53)) }
