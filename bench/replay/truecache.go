package replay

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/scheduler"
)

// trueCache picks workers by the default cost fed with the engines' true
// caches: the true cached prefix (read through a CacheProbe, not from
// events) or the prefix of a request it already sent there and that has
// not finished (its blocks are about to be cached), plus the default cost's
// load term computed from what it routed itself:
//
//	cost = max(0, (prefill_tokens + ISL)/block_size − credit x overlap) + decode_weight x (active_blocks + request_blocks − overlap)
//
// It shows what the event lag and a stale index cost the default cost: same
// cost function, same bookings (max_tokens, never the true output), no lag.
// It is not a bound on anything: it moves with the default's weights, and
// kvrouter has beaten it. The load term comes from the router's own load
// view when the stack exposes it (LoadProbe: one request to the route API's
// workers call per decision), so that only the overlap differs from
// kvrouter's; otherwise from its own bookkeeping. Its choice reaches the
// router as a Soft preference, which the default policy keeps while the
// worker is a candidate: admission (waiting in the router when every worker
// is busy) stays the router's, as for kvrouter. A pin would instead make
// the request wait for that one worker whenever it is busy.
type trueCache struct {
	mu    sync.Mutex
	loads LoadProbe // the router's load view; nil = own bookkeeping
	view  map[string]LoadSample
	// busyPrefill and busyDecode are the router's queue thresholds in
	// tokens and blocks (0 = no queueing): with the router's load view it,
	// like the router, picks among workers that are not busy while
	// there is one (a Soft preference for a busy worker is not kept).
	busyPrefill, busyDecode float64
	probe                   CacheProbe
	bs                      float64
	workers                 []string
	load                    map[string]*trueCacheLoad
	cached                  map[string]int
	rnd                     *rand.Rand
}

type trueCacheLoad struct {
	prefillTokens int
	blocks        int
	inflight      map[kvevents.SeqHash]int // prompt blocks of requests not yet freed
}

// booking is what one pick added, to take back later.
type booking struct {
	worker  string
	prefill int
	blocks  int
	hashes  []kvevents.SeqHash
}

func newTrueCache(probe CacheProbe, loads LoadProbe, workers []string, blockSize int, seed uint64, busyPrefill, busyDecode float64) *trueCache {
	o := &trueCache{probe: probe, loads: loads, view: map[string]LoadSample{}, busyPrefill: busyPrefill, busyDecode: busyDecode, bs: float64(blockSize), workers: workers, load: map[string]*trueCacheLoad{},
		cached: map[string]int{}, rnd: rand.New(rand.NewPCG(seed, 0x0ac1e))}
	for _, w := range workers {
		o.load[w] = &trueCacheLoad{inflight: map[kvevents.SeqHash]int{}}
	}
	return o
}

func (o *trueCache) pick(ctx context.Context, p *prepared) *booking {
	o.mu.Lock()
	defer o.mu.Unlock()
	useView := false
	if o.loads != nil {
		clear(o.view)
		useView = o.loads.Loads(ctx, o.view) == nil
	}
	clear(o.cached)
	o.probe.CachedPrefix(p.hashes, o.cached)
	isl := float64(p.req.InputLength)
	n := len(p.hashes)
	busy := func(w string) bool {
		if !useView || o.busyPrefill <= 0 {
			return false
		}
		v := o.view[w]
		return float64(v.PrefillTokens) >= o.busyPrefill || float64(v.DecodeBlocks) >= o.busyDecode
	}
	anyFree := false
	for _, w := range o.workers {
		anyFree = anyFree || !busy(w)
	}
	best, bestCost, ties := "", math.Inf(1), 0
	bestOverlap := 0
	// The default cost with true caches, its decode-block weight whole:
	// the reference has no admission queue or routing history whose
	// cached share it could follow.
	cp := scheduler.DefaultCostParams()
	eligible := func(w string) bool { return !anyFree || !busy(w) }
	// loadOf is a worker's queued prefill tokens and decode blocks: the
	// engines' view when it was read, else the bookings.
	loadOf := func(w string) (prefill, blocks int) {
		if useView {
			v := o.view[w]
			return v.PrefillTokens, v.DecodeBlocks
		}
		return o.load[w].prefillTokens, o.load[w].blocks
	}
	least := math.MaxInt
	for _, w := range o.workers {
		if eligible(w) {
			prefill, _ := loadOf(w)
			least = min(least, prefill)
		}
	}
	credit := cp.CreditAt(int64(least)) // the default's load-following credit
	for _, w := range o.workers {
		if !eligible(w) {
			continue
		}
		l := o.load[w]
		ov := o.cached[w]
		k := 0
		for k < n && l.inflight[p.hashes[k]] > 0 {
			k++
		}
		ov = max(ov, k)
		prefill, blocks := loadOf(w)
		// The default cost's terms, with the true overlap.
		pre := cp.PrefillLoadScale * math.Max(0, (float64(prefill)+isl)/o.bs-credit*float64(ov))
		cost := pre + cp.DecodeBlockWeight*float64(blocks+n-ov)
		switch {
		case cost < bestCost:
			best, bestCost, ties, bestOverlap = w, cost, 1, ov
		case cost == bestCost:
			ties++
			if o.rnd.IntN(ties) == 0 {
				best, bestOverlap = w, ov
			}
		}
	}
	b := &booking{worker: best, prefill: max(0, p.req.InputLength-bestOverlap*int(o.bs)), blocks: n - bestOverlap + int(math.Ceil(float64(p.maxTokens)/o.bs)), hashes: p.hashes}
	l := o.load[best]
	l.prefillTokens += b.prefill
	l.blocks += b.blocks
	for _, h := range b.hashes {
		l.inflight[h]++
	}
	return b
}

// prefillDone removes the booking's prefill tokens (first token seen).
func (o *trueCache) prefillDone(b *booking) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.load[b.worker].prefillTokens -= b.prefill
	b.prefill = 0
}

// free releases the rest of the booking.
func (o *trueCache) free(b *booking) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.load[b.worker]
	l.prefillTokens -= b.prefill
	l.blocks -= b.blocks
	for _, h := range b.hashes {
		if l.inflight[h]--; l.inflight[h] <= 0 {
			delete(l.inflight, h)
		}
	}
	b.prefill, b.blocks, b.hashes = 0, 0, nil
}
