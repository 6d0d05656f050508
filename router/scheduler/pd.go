package scheduler

// Prefill/decode disaggregation: worker roles, request legs, eligibility by
// role and the decode leg's cost. The host asks for the two legs of a split
// request as two scheduling requests (LegDecode under the session's
// binding and the pin rule, then LegPrefill without either); docs/pd.md has
// the model.

import (
	"math"
)

// Role is a worker's part in a disaggregated fleet. The zero value is
// RoleBoth, so a fleet that never mentions roles is unchanged.
type Role uint8

const (
	RoleBoth    Role = iota // whole requests and both legs
	RolePrefill             // prefill legs only
	RoleDecode              // decode legs and whole requests
)

// Leg is the part of a request one scheduling request is for.
type Leg uint8

const (
	LegWhole   Leg = iota // not split: the worker prefills and decodes
	LegDecode             // the decode leg of a split request
	LegPrefill            // the prefill leg of a split request
	numLegs
)

// bar is the role flag that excludes a slot from leg's candidates.
func (l Leg) bar() uint8 {
	if l == LegPrefill {
		return fDecodeOnly
	}
	return fPrefillOnly
}

// String names the leg as metrics and logs do.
func (l Leg) String() string {
	switch l {
	case LegDecode:
		return "decode"
	case LegPrefill:
		return "prefill"
	}
	return "whole"
}

// setRole records slot s's role in its flags and keeps roled in step.
func (f *fleet) setRole(s int32, r Role) {
	var want uint8
	switch r {
	case RolePrefill:
		want = fPrefillOnly
	case RoleDecode:
		want = fDecodeOnly
	}
	had := f.flags[s] & fRoles
	if had == want {
		return
	}
	if had != 0 {
		f.roled--
	}
	if want != 0 {
		f.roled++
	}
	f.flags[s] = f.flags[s]&^fRoles | want
	f.eligDirty = true
}

// serves reports whether slot s's role lets it take leg.
func (f *fleet) serves(s int32, leg Leg) bool { return f.flags[s]&leg.bar() == 0 }

// splitByLeg rebuilds eligLeg from elig.
func (f *fleet) splitByLeg() {
	for leg := range numLegs {
		l := f.eligLeg[leg][:0]
		for _, s := range f.elig {
			if f.serves(s, leg) {
				l = append(l, s)
			}
		}
		f.eligLeg[leg] = l
	}
}

// legOK: slot s may take w's leg (always true in a fleet without roles).
func (c *core) legOK(w *waiter, s int32) bool {
	return c.fl.roled == 0 || c.fl.serves(s, w.req.Leg)
}

// DecodeCostParams weigh the decode leg's cost (the default policy's
// selection for LegDecode):
//
//	cost = PrefillLoadScale · active_prefill_tokens / block_size
//	     + TransferBlockWeight · max(0, prompt_blocks − overlap_blocks)
//	     + DecodeBlockWeight · potential_decode_blocks
//	     + DecodeActiveRequestWeight · active_requests
//	     + FullPenalty, when potential_decode_blocks exceeds kv_blocks
//
// The first term is the prefill work already queued there (a `both`
// worker's own prefills, or the decode engine's share of them), which
// delays this request's first decode step; the second the blocks to pull
// from the prefill engine (the ones the decode worker holds are not
// transferred: a conversation's decode worker often holds most of the
// prompt); the third and fourth the decode load, which sets the time per
// output token; the last makes a worker whose free KV blocks cannot hold
// the request a last resort.
type DecodeCostParams struct {
	PrefillLoadScale          float64 `yaml:"prefill_load_scale"`
	TransferBlockWeight       float64 `yaml:"transfer_block_weight"`
	DecodeBlockWeight         float64 `yaml:"decode_block_weight"`
	DecodeActiveRequestWeight float64 `yaml:"decode_active_request_weight"`
	FullPenalty               float64 `yaml:"full_penalty"`
}

// DefaultDecodeCostParams: a transferred block costs a quarter of a
// prefilled one (a NIXL pull is a memory copy, not a forward pass, but it
// delays the first token by its size), decode blocks weigh 0.1 as in the
// default cost, each running request 1 block, and an overfull worker 1e6.
func DefaultDecodeCostParams() DecodeCostParams {
	return DecodeCostParams{PrefillLoadScale: 1, TransferBlockWeight: 0.25, DecodeBlockWeight: 0.1,
		DecodeActiveRequestWeight: 1, FullPenalty: 1e6}
}

// pickMinDecodeCost is the decode leg's selection at temperature 0 (lowest
// cost, random tie-break; with only, among the Soft target's rows).
func pickMinDecodeCost(x *Context, c *Candidates, dp *DecodeCostParams, only bool) int {
	f := c.f
	inv := x.invBlockSize()
	blocks := float64(x.RequestBlocks)
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
		potential := f.decode[s] + c.newBlks - int64(c.shared[s])
		cost := dp.PrefillLoadScale*float64(f.prefill[s])*inv + dp.TransferBlockWeight*max(0, blocks-o) +
			dp.DecodeBlockWeight*float64(potential) + dp.DecodeActiveRequestWeight*float64(f.active[s])
		if kv := f.kvBlocks[s]; kv > 0 && potential > kv {
			cost += dp.FullPenalty
		}
		if cost < best {
			best, bi, ties = cost, i, 1
		} else if cost == best {
			bi, ties = x.rng.keepTied(bi, i, ties)
		}
	}
	return bi
}
