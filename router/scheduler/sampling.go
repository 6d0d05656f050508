package scheduler

// Softmax sampling over costs, shared by the default policy and the
// softmax picker.

import (
	"math"
)

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
	credit := cp.credit(c) // one credit here (CostParams.plain)
	step := cp.PrefillStepTokens * inv
	var cost [2]float64
	for i, s := range c.slots[:2] {
		o := 0.0
		if v := ov[s]; v >= ep {
			o = float64(uint32(v))
		}
		pre := (prefill[s]+isl)*inv - credit*o
		if pre < 0 {
			pre = 0
		}
		if c.paysStep(step, prefill[s] > 0, s, o) {
			pre += step
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
