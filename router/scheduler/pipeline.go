package scheduler

// The llm-d style Pipeline policy and the parts a pipeline is built from:
// scorers, pickers and filters (their interfaces are in policy.go).

import (
	"fmt"
	"math"
)

// WeightedScorer is one term of a Pipeline's cost.
type WeightedScorer struct {
	Scorer Scorer
	Weight float64
}

// Pipeline is the llm-d style policy: filters, then weighted scorers, then a
// picker. A filter that leaves nothing makes Select fail with ErrNoCandidate.
type Pipeline struct {
	PolicyName string
	Filters    []Filter
	Scorers    []WeightedScorer
	Picker     Picker // nil: MinPicker
}

// Name implements Policy.
func (p *Pipeline) Name() string {
	if p.PolicyName == "" {
		return "pipeline"
	}
	return p.PolicyName
}

// Select implements Policy.
func (p *Pipeline) Select(x *Context, c *Candidates) (int, error) {
	for _, f := range p.Filters {
		n := c.Len()
		keep := x.bools(n)
		for i := range keep {
			keep[i] = true
		}
		f.Filter(x, c, keep)
		c.Retain(keep)
		if c.Len() == 0 {
			return 0, fmt.Errorf("%w: filter %T left none of %d", ErrNoCandidate, f, n)
		}
	}
	n := c.Len()
	if n == 0 {
		return 0, ErrNoCandidate
	}
	cost := x.costs(n)
	if len(p.Scorers) == 1 && p.Scorers[0].Weight == 1 {
		p.Scorers[0].Scorer.Score(x, c, cost) // a scorer writes every row
	} else {
		clear(cost)
		tmp := x.tmp(n)
		for _, ws := range p.Scorers {
			ws.Scorer.Score(x, c, tmp)
			for i, v := range tmp {
				cost[i] += ws.Weight * v
			}
		}
	}
	pk := p.Picker
	if pk == nil {
		pk = MinPicker{}
	}
	return pk.Pick(x, c, cost)
}

// DefaultCost is the default cost function as a pipeline Scorer.
type DefaultCost struct{ Params CostParams }

// Score implements Scorer.
func (s DefaultCost) Score(x *Context, c *Candidates, cost []float64) {
	var tmp CostParams
	scoreDefault(x, c, s.Params.at(x, c, &tmp), cost)
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
