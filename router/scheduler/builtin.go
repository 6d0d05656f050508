package scheduler

import (
	"math"
)

// Seeded is implemented by policies whose configuration carries a seed for
// reproducible picks; the scheduler seeds its random source from it unless
// Config has a seed.
type Seeded interface {
	Seed() (uint64, bool)
}

// CostParams are the default cost function's weights:
//
//	cost = PrefillLoadScale · max(0, (active_prefill_tokens + ISL)/block_size − OverlapCredit · overlap_blocks)
//	     + DecodeBlockWeight · potential_decode_blocks + DecodeActiveRequestWeight · active_requests
//
// where potential_decode_blocks counts prompt blocks already active on the
// worker once. DecodeBlockWeight is not one of Dynamo's parameters (Dynamo
// weighs decode blocks 1): in an engine step a decode block costs far less
// time than a prefill block (docs/benchmarks.md, "Default policy
// experiments"), so a weight below 1 lets the cache outweigh memory load.
// Build CostParams from DefaultCostParams: a zero DecodeBlockWeight ignores
// decode load.
type CostParams struct {
	PrefillLoadScale          float64 `yaml:"prefill_load_scale"`
	OverlapCredit             float64 `yaml:"overlap_credit"`
	DecodeActiveRequestWeight float64 `yaml:"decode_active_request_weight"`
	DecodeBlockWeight         float64 `yaml:"decode_block_weight"`
}

// DefaultCostParams: prefill load scale 1, overlap credit 4, decode-block
// weight 0.1, request weight 0. Measured against Dynamo's weights
// (DynamoCostParams) on the Mooncake conversation and synthetic traces at two
// loads each (docs/benchmarks.md, "Default policy experiments"): a decode
// block costs an engine step a small fraction of what a prefill block costs,
// so weight 1 let a busy cache holder's decode blocks outweigh its cache;
// and a cached block is worth more than the one block of this request's
// prefill it saves (credit 1): recomputing it elsewhere also delays every
// request queued behind there, and the moved session loses its cache for its
// later turns. Neither weight alone helped; together they raised the hit
// ratio and lowered TTFT p50 and p99 in every setting measured.
func DefaultCostParams() CostParams {
	return CostParams{PrefillLoadScale: 1, OverlapCredit: 4, DecodeBlockWeight: 0.1}
}

// DynamoCostParams are Dynamo's default weights: scale 1, credit 1,
// decode-block weight 1, request weight 0 (the `dynamo` policy).
func DynamoCostParams() CostParams {
	return CostParams{PrefillLoadScale: 1, OverlapCredit: 1, DecodeBlockWeight: 1}
}

// DefaultPolicy is the builtin default: the cost function above, then a
// picker that takes the minimum with a uniform random tie-break at
// temperature 0 and samples softmax(−normalised cost / T) above it. It keeps
// a Soft target while the target is a candidate (ranked and worker-only
// targets; with or without sampling, the choice is limited to the target's
// rows). Scorer and picker are fused into one pass over the candidates.
type DefaultPolicy struct {
	Cost        CostParams
	Temperature float64
	SeedValue   uint64
	HasSeed     bool
}

// NewDefaultPolicy returns the default policy at temperature t.
func NewDefaultPolicy(t float64) *DefaultPolicy {
	return &DefaultPolicy{Cost: DefaultCostParams(), Temperature: t}
}

// NewDynamoPolicy returns Dynamo's current default cost at temperature t:
// the default policy with DynamoCostParams.
func NewDynamoPolicy(t float64) *DefaultPolicy {
	return &DefaultPolicy{Cost: DynamoCostParams(), Temperature: t}
}

// Name implements Policy.
func (p *DefaultPolicy) Name() string { return "default" }

// Seed implements Seeded.
func (p *DefaultPolicy) Seed() (uint64, bool) { return p.SeedValue, p.HasSeed }

// Select implements Policy.
func (p *DefaultPolicy) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	only := c.hasAff && c.anyAffinityTarget()
	if p.Temperature <= 0 {
		if !only && !c.anyShared && p.Cost.DecodeActiveRequestWeight == 0 {
			return pickMinCostPlain(x, c, &p.Cost), nil
		}
		return pickMinCost(x, c, &p.Cost, only), nil
	}
	if len(c.slots) == 2 && !only && !c.anyShared && p.Cost.DecodeActiveRequestWeight == 0 {
		return samplePairPlain(x, c, &p.Cost, p.Temperature), nil
	}
	cost := x.costs(c.Len())
	lo, hi, m := scoreDefaultRange(x, c, &p.Cost, cost, only)
	return sampleSoftmax(x, cost, lo, hi, m, p.Temperature), nil
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

// pickMinCost is the fused default scorer + temperature-0 picker.
func pickMinCost(x *Context, c *Candidates, cp *CostParams, only bool) int {
	if !only && !c.anyShared && cp.DecodeActiveRequestWeight == 0 {
		return pickMinCostPlain(x, c, cp)
	}
	f := c.f
	inv := x.invBlockSize()
	isl := float64(x.PromptTokens)
	scale, credit, w, dw := cp.PrefillLoadScale, cp.OverlapCredit, cp.DecodeActiveRequestWeight, cp.DecodeBlockWeight
	newBlks := c.newBlks
	prefill, decode, active, shared := f.prefill, f.decode, f.active, c.shared
	ov, ep := c.ov, c.epoch
	best, bi, ties := math.Inf(1), 0, 0
	for i, s := range c.slots {
		if only && !c.aff.matches(f, s) {
			continue
		}
		o := 0.0
		if v := ov[s]; v >= ep {
			o = float64(uint32(v))
		}
		pre := (float64(prefill[s])+isl)*inv - credit*o
		if pre < 0 {
			pre = 0
		}
		cost := scale*pre + dw*float64(decode[s]+newBlks-int64(shared[s])) + w*float64(active[s])
		if cost < best {
			best, bi, ties = cost, i, 1
		} else if cost == best {
			bi, ties = x.rng.keepTied(bi, i, ties)
		}
	}
	return bi
}

// pickMinCostPlain is pickMinCost for the common case: no Soft target among
// the candidates, no prompt blocks shared with active requests, no
// active-request weight. Same costs, same tie-break draws.
func pickMinCostPlain(x *Context, c *Candidates, cp *CostParams) int {
	inv := x.invBlockSize()
	isl := float64(x.PromptTokens)
	scale, credit, dw := cp.PrefillLoadScale, cp.OverlapCredit, cp.DecodeBlockWeight
	newBlks := float64(c.newBlks)
	prefill, decode := c.prefillF, c.decodeF
	ov, ep := c.ov, c.epoch
	best, bi, ties := math.Inf(1), 0, 0
	for i, s := range c.slots {
		o := 0.0
		if v := ov[s]; v >= ep {
			o = float64(uint32(v))
		}
		pre := (prefill[s]+isl)*inv - credit*o
		if pre < 0 {
			pre = 0
		}
		cost := scale*pre + dw*(decode[s]+newBlks)
		if cost < best {
			best, bi, ties = cost, i, 1
		} else if cost == best {
			bi, ties = x.rng.keepTied(bi, i, ties)
		}
	}
	return bi
}

func scoreDefault(x *Context, c *Candidates, cp *CostParams, cost []float64) {
	f := c.f
	inv := x.invBlockSize()
	isl := float64(x.PromptTokens)
	scale, credit, w, dw := cp.PrefillLoadScale, cp.OverlapCredit, cp.DecodeActiveRequestWeight, cp.DecodeBlockWeight
	newBlks := c.newBlks
	prefill, decode, active, shared := f.prefill, f.decode, f.active, c.shared
	ov, ep := c.ov, c.epoch
	cost = cost[:len(c.slots)]
	for i, s := range c.slots {
		o := 0.0
		if v := ov[s]; v >= ep {
			o = float64(uint32(v))
		}
		pre := (float64(prefill[s])+isl)*inv - credit*o
		if pre < 0 {
			pre = 0
		}
		cost[i] = scale*pre + dw*float64(decode[s]+newBlks-int64(shared[s])) + w*float64(active[s])
	}
}

// pickMin takes the lowest cost with a uniform random tie-break; with only,
// among the Soft target's rows.
func pickMin(x *Context, c *Candidates, cost []float64, only bool) int {
	best, bi, ties := math.Inf(1), 0, 0
	for i, v := range cost[:len(c.slots)] {
		if only && !c.aff.matches(c.f, c.slots[i]) {
			continue
		}
		if v < best {
			best, bi, ties = v, i, 1
		} else if v == best {
			bi, ties = x.rng.keepTied(bi, i, ties)
		}
	}
	return bi
}

// pickSoftmax samples p ∝ exp(−(c−min)/((max−min)·T)); all-equal costs give
// a uniform choice. With only, rows outside the Soft target get p = 0.
func pickSoftmax(x *Context, c *Candidates, cost []float64, t float64, only bool) int {
	n := len(c.slots)
	cost = cost[:n]
	lo, hi := math.Inf(1), math.Inf(-1)
	m := 0
	for i, v := range cost {
		if only && !c.aff.matches(c.f, c.slots[i]) {
			cost[i] = math.NaN()
			continue
		}
		m++
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	return sampleSoftmax(x, cost, lo, hi, m, t)
}

// scoreDefaultRange writes the default costs and returns their range and
// count; with only, rows outside the Soft target get NaN (excluded). The
// range is tracked with plain compares: the min/max builtins handle NaN and
// signed zeros, which costs more than the rest of the loop.
func scoreDefaultRange(x *Context, c *Candidates, cp *CostParams, cost []float64, only bool) (lo, hi float64, m int) {
	if !only && !c.anyShared && cp.DecodeActiveRequestWeight == 0 {
		return scoreDefaultRangePlain(x, c, cp, cost)
	}
	scoreDefault(x, c, cp, cost)
	cost = cost[:len(c.slots)]
	lo, hi = math.Inf(1), math.Inf(-1)
	if !only {
		for _, v := range cost {
			if v < lo {
				lo = v
			}
			if v > hi {
				hi = v
			}
		}
		return lo, hi, len(cost)
	}
	for i, v := range cost {
		if !c.aff.matches(c.f, c.slots[i]) {
			cost[i] = math.NaN()
			continue
		}
		m++
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	return lo, hi, m
}

// scoreDefaultRangePlain is scoreDefaultRange in one pass for the common
// case (see pickMinCostPlain).
func scoreDefaultRangePlain(x *Context, c *Candidates, cp *CostParams, cost []float64) (lo, hi float64, m int) {
	inv := x.invBlockSize()
	isl := float64(x.PromptTokens)
	scale, credit, dw := cp.PrefillLoadScale, cp.OverlapCredit, cp.DecodeBlockWeight
	newBlks := float64(c.newBlks)
	prefill, decode := c.prefillF, c.decodeF
	ov, ep := c.ov, c.epoch
	cost = cost[:len(c.slots)]
	lo, hi = math.Inf(1), math.Inf(-1)
	for i, s := range c.slots {
		o := 0.0
		if v := ov[s]; v >= ep {
			o = float64(uint32(v))
		}
		pre := (prefill[s]+isl)*inv - credit*o
		if pre < 0 {
			pre = 0
		}
		v := scale*pre + dw*(decode[s]+newBlks)
		cost[i] = v
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	return lo, hi, len(cost)
}

// sampleSoftmax draws a row from costs whose included values (non-NaN, m
// of them) span [lo, hi], with p ∝ exp(−(c−lo)/((hi−lo)·T)). It may
// overwrite cost with the weights.
//
// It first tries rejection sampling: propose a row uniformly and accept it
// with probability equal to its weight (at most 1: the cheapest row has
// weight 1). An accepted proposal is an exact draw, and the expected number
// of proposals is n/Σweights — a handful unless the temperature is tiny —
// so most selections skip the pass that exponentiates every row. After
// rejectionTrials refusals it falls back to the exact linear pass; a draw
// from the target either way is a draw from the target.
func sampleSoftmax(x *Context, cost []float64, lo, hi float64, m int, t float64) int {
	if hi <= lo { // one row or all equal: uniform over the included rows
		k := x.rng.intn(m)
		for i, v := range cost {
			if v == v { // not NaN
				if k == 0 {
					return i
				}
				k--
			}
		}
		return 0
	}
	scale := -1 / ((hi - lo) * t)
	trials := rejectionTrials
	if len(cost) <= 8 {
		trials = 0 // a few rows: the linear pass is as cheap as the proposals
	}
	for range trials {
		i := x.rng.intn(len(cost))
		v := cost[i]
		if v != v {
			continue // excluded row: weight 0
		}
		if x.rng.float64() < expNeg((v-lo)*scale) {
			return i
		}
	}
	if m == len(cost) { // every row included: no NaN or zero-weight checks
		sum := 0.0
		for i, v := range cost {
			e := expNeg((v - lo) * scale)
			cost[i] = e
			sum += e
		}
		u := x.rng.float64() * sum
		for i, e := range cost {
			if u -= e; u < 0 {
				return i
			}
		}
		return len(cost) - 1 // rounding: u landed on the total
	}
	sum := 0.0
	for i, v := range cost {
		if v != v {
			cost[i] = 0
			continue
		}
		e := expNeg((v - lo) * scale)
		cost[i] = e
		sum += e
	}
	u := x.rng.float64() * sum
	last := 0
	for i, e := range cost {
		if e == 0 {
			continue
		}
		last = i
		u -= e
		if u < 0 {
			return i
		}
	}
	return last // rounding: u landed on the total
}

// samplePairPlain is sampleSoftmax over exactly two rows in the plain case
// (see pickMinCostPlain), the common two-worker deployment. Normalised by
// their range the two costs are always 0 and 1, so the weights are 1 and
// e^(−1/T): a constant, cached in the Context, instead of a cost buffer, a
// range pass and two exponentials per selection. Same draws as
// sampleSoftmax (one intn(2) for a tie, else one float64).
func samplePairPlain(x *Context, c *Candidates, cp *CostParams, t float64) int {
	inv := x.invBlockSize()
	isl := float64(x.PromptTokens)
	newBlks := float64(c.newBlks)
	prefill, decode := c.prefillF, c.decodeF
	ov, ep := c.ov, c.epoch
	var cost [2]float64
	for i, s := range c.slots[:2] {
		o := 0.0
		if v := ov[s]; v >= ep {
			o = float64(uint32(v))
		}
		pre := (prefill[s]+isl)*inv - cp.OverlapCredit*o
		if pre < 0 {
			pre = 0
		}
		cost[i] = cp.PrefillLoadScale*pre + cp.DecodeBlockWeight*(decode[s]+newBlks)
	}
	if cost[0] == cost[1] {
		return x.rng.intn(2)
	}
	if x.pairT != t {
		x.pairT, x.pairW = t, expNeg(-1/t)
	}
	w0 := 1.0 // weight of row 0: 1 when it is the cheaper row
	if cost[0] > cost[1] {
		w0 = x.pairW
	}
	if x.rng.float64()*(1+x.pairW) < w0 {
		return 0
	}
	return 1
}

// rejectionTrials bounds the rejection attempts before the linear pass.
const rejectionTrials = 16

// expNeg is e^x for x <= 0, to a relative error below 2e-7 (plenty for
// sampling weights) and several times faster than math.Exp: x·log2(e) is
// split into an integer k (the float's exponent) and a remainder whose e^f,
// |f| <= ln2/2, is a degree-6 polynomial evaluated in Estrin's scheme (short
// dependency chains: with two workers the latency is what counts).
func expNeg(x float64) float64 {
	if x < -700 {
		return 0
	}
	const shifter = 0x1.8p52 // adding it rounds to an integer in the low bits
	t := x * math.Log2E
	n := (t + shifter) - shifter
	f := (t - n) * math.Ln2
	f2 := f * f
	p := (1 + f) + f2*((1.0/2+f*(1.0/6))+f2*((1.0/24+f*(1.0/120))+f2*(1.0/720)))
	return math.Float64frombits(uint64(int64(n)+1023)<<52) * p
}

// DefaultCost is the default cost function as a pipeline Scorer.
type DefaultCost struct{ Params CostParams }

// Score implements Scorer.
func (s DefaultCost) Score(x *Context, c *Candidates, cost []float64) {
	scoreDefault(x, c, &s.Params, cost)
}

// MinPicker takes the lowest cost, ties broken uniformly at random. With
// RespectSoftAffinity it keeps the Soft target while it is a candidate.
type MinPicker struct{ RespectSoftAffinity bool }

// Pick implements Picker.
func (p MinPicker) Pick(x *Context, c *Candidates, cost []float64) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	return pickMin(x, c, cost, p.RespectSoftAffinity && c.anyAffinityTarget()), nil
}

// SoftmaxPicker samples by softmax over range-normalised costs at
// Temperature (<= 0 behaves as MinPicker).
type SoftmaxPicker struct {
	Temperature         float64
	RespectSoftAffinity bool
}

// Pick implements Picker.
func (p SoftmaxPicker) Pick(x *Context, c *Candidates, cost []float64) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	only := p.RespectSoftAffinity && c.anyAffinityTarget()
	if p.Temperature <= 0 {
		return pickMin(x, c, cost, only), nil
	}
	return pickSoftmax(x, c, cost, p.Temperature, only), nil
}

// RandomPicker ignores the costs and picks uniformly.
type RandomPicker struct{}

// Pick implements Picker.
func (RandomPicker) Pick(x *Context, c *Candidates, _ []float64) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	return x.IntN(c.Len()), nil
}

// Scorers usable in pipelines.
type (
	// ActiveRequestsScorer: cost = active requests.
	ActiveRequestsScorer struct{}
	// PrefillTokensScorer: cost = (active prefill tokens + uncached ISL) / block size.
	PrefillTokensScorer struct{}
	// DecodeBlocksScorer: cost = potential decode blocks.
	DecodeBlocksScorer struct{}
	// OverlapScorer: cost = −overlap blocks (more cache is better).
	OverlapScorer struct{}
	// KVUsageScorer: cost = potential decode blocks / KV blocks (0 when unknown).
	KVUsageScorer struct{}
)

// Score implements Scorer.
func (ActiveRequestsScorer) Score(_ *Context, c *Candidates, cost []float64) {
	for i := range c.slots {
		cost[i] = float64(c.ActiveRequests(i))
	}
}

// Score implements Scorer.
func (PrefillTokensScorer) Score(x *Context, c *Candidates, cost []float64) {
	inv := x.invBlockSize()
	for i := range c.slots {
		v := (float64(c.ActivePrefillTokens(i)+x.PromptTokens))*inv - float64(c.OverlapBlocks(i))
		cost[i] = max(0, v)
	}
}

// Score implements Scorer.
func (DecodeBlocksScorer) Score(_ *Context, c *Candidates, cost []float64) {
	for i := range c.slots {
		cost[i] = float64(c.PotentialDecodeBlocks(i))
	}
}

// Score implements Scorer.
func (OverlapScorer) Score(_ *Context, c *Candidates, cost []float64) {
	for i := range c.slots {
		cost[i] = -float64(c.OverlapBlocks(i))
	}
}

// Score implements Scorer.
func (KVUsageScorer) Score(_ *Context, c *Candidates, cost []float64) {
	for i := range c.slots {
		if kv := c.KVBlocks(i); kv > 0 {
			cost[i] = float64(c.PotentialDecodeBlocks(i)) / float64(kv)
		} else {
			cost[i] = 0
		}
	}
}

// SoftAffinityFilter keeps only the Soft target's rows when the target is a
// candidate, and everything otherwise (it never empties the set).
type SoftAffinityFilter struct{}

// Filter implements Filter.
func (SoftAffinityFilter) Filter(_ *Context, c *Candidates, keep []bool) {
	if !c.anyAffinityTarget() {
		return
	}
	for i, s := range c.slots {
		keep[i] = c.aff.matches(c.f, s)
	}
}

// NotBusyFilter drops candidates over a queue threshold unless all are.
type NotBusyFilter struct{}

// Filter implements Filter.
func (NotBusyFilter) Filter(_ *Context, c *Candidates, keep []bool) {
	any := false
	for i := range c.slots {
		if !c.Busy(i) {
			any = true
			break
		}
	}
	if !any {
		return
	}
	for i := range c.slots {
		keep[i] = !c.Busy(i)
	}
}

// softAffinity wraps a policy so that a Soft target that is a candidate is
// the only candidate the inner policy sees (the respect_soft_affinity option
// of the load-balancing builtins).
type softAffinity struct{ inner Policy }

func (p softAffinity) Name() string { return p.inner.Name() }

func (p softAffinity) Select(x *Context, c *Candidates) (int, error) {
	if c.anyAffinityTarget() {
		keep := x.bools(c.Len())
		for i, s := range c.slots {
			keep[i] = c.aff.matches(c.f, s)
		}
		c.Retain(keep)
	}
	return p.inner.Select(x, c)
}

// RoundRobin cycles through the candidates by the scheduler's selection
// counter (pure: the counter is in the context).
type RoundRobin struct{}

// Name implements Policy.
func (RoundRobin) Name() string { return "round-robin" }

// Select implements Policy.
func (RoundRobin) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	return int(x.Seq % uint64(c.Len())), nil
}

// Random picks uniformly.
type Random struct{}

// Name implements Policy.
func (Random) Name() string { return "random" }

// Select implements Policy.
func (Random) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	return x.IntN(c.Len()), nil
}

// lighter orders two candidates by active requests, then booked prefill
// tokens: -1 when i is less loaded, 1 when j is, 0 when equal.
func lighter(c *Candidates, i, j int) int {
	si, sj := c.slots[i], c.slots[j]
	switch {
	case c.f.active[si] < c.f.active[sj]:
		return -1
	case c.f.active[si] > c.f.active[sj]:
		return 1
	case c.f.prefill[si] < c.f.prefill[sj]:
		return -1
	case c.f.prefill[si] > c.f.prefill[sj]:
		return 1
	}
	return 0
}

// leastLoaded returns the least-loaded candidate among those accepted by in
// (nil = all), ties broken uniformly at random; -1 when none.
func leastLoaded(x *Context, c *Candidates, in func(i int) bool) int {
	bi, ties := -1, 0
	for i := range c.slots {
		if in != nil && !in(i) {
			continue
		}
		if bi < 0 {
			bi, ties = i, 1
			continue
		}
		switch lighter(c, i, bi) {
		case -1:
			bi, ties = i, 1
		case 0:
			bi, ties = x.rng.keepTied(bi, i, ties)
		}
	}
	return bi
}

// LeastLoaded picks the candidate with the fewest active requests (then the
// least booked prefill), ties at random.
type LeastLoaded struct{}

// Name implements Policy.
func (LeastLoaded) Name() string { return "least-loaded" }

// Select implements Policy.
func (LeastLoaded) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	return leastLoaded(x, c, nil), nil
}

// PowerOfTwo samples two distinct candidates and keeps the lighter.
type PowerOfTwo struct{}

// Name implements Policy.
func (PowerOfTwo) Name() string { return "power-of-two" }

// Select implements Policy.
func (PowerOfTwo) Select(x *Context, c *Candidates) (int, error) {
	n := c.Len()
	switch n {
	case 0:
		return 0, ErrNoCandidate
	case 1:
		return 0, nil
	}
	a := x.IntN(n)
	b := x.IntN(n - 1)
	if b >= a {
		b++
	}
	if lighter(c, b, a) < 0 {
		return b, nil
	}
	return a, nil
}

// TwoTier is SGLang's cache-aware decision as a policy: (1) when the load
// spread is large — max − min active requests > BalanceAbs and max >
// BalanceRel × min — take the least-loaded worker; (2) otherwise, when the
// best overlap ratio (overlap blocks / prompt blocks) is > CacheThreshold,
// the least-loaded worker among those with that best overlap; (3) otherwise
// the least-loaded worker. With RespectSoftAffinity a Soft target that is a
// candidate is kept unless tier 1 fires.
type TwoTier struct {
	CacheThreshold      float64 `yaml:"cache_threshold"`
	BalanceAbs          float64 `yaml:"balance_abs_threshold"`
	BalanceRel          float64 `yaml:"balance_rel_threshold"`
	RespectSoftAffinity bool    `yaml:"respect_soft_affinity"`
}

// NewTwoTier returns the policy with SGLang's library defaults 0.5, 32, 1.1.
func NewTwoTier() *TwoTier { return &TwoTier{CacheThreshold: 0.5, BalanceAbs: 32, BalanceRel: 1.1} }

// Name implements Policy.
func (*TwoTier) Name() string { return "two-tier" }

// Select implements Policy.
func (p *TwoTier) Select(x *Context, c *Candidates) (int, error) {
	n := c.Len()
	if n == 0 {
		return 0, ErrNoCandidate
	}
	lo, hi := int32(math.MaxInt32), int32(math.MinInt32)
	bestOv := int32(0)
	for _, s := range c.slots {
		a := c.f.active[s]
		lo, hi = min(lo, a), max(hi, a)
		bestOv = max(bestOv, c.ovAt(s))
	}
	if float64(hi-lo) > p.BalanceAbs && float64(hi) > p.BalanceRel*float64(lo) {
		return leastLoaded(x, c, nil), nil
	}
	if p.RespectSoftAffinity && c.anyAffinityTarget() {
		return leastLoaded(x, c, func(i int) bool { return c.aff.matches(c.f, c.slots[i]) }), nil
	}
	if x.RequestBlocks > 0 && float64(bestOv)/float64(x.RequestBlocks) > p.CacheThreshold {
		return leastLoaded(x, c, func(i int) bool { return c.ovAt(c.slots[i]) == bestOv }), nil
	}
	return leastLoaded(x, c, nil), nil
}
