package replay

// Prefill/decode disaggregation (docs/pd.md): a run with a split fleet
// (Config.Fleet, `bench replay --fleet 4p4d`) runs its PD policies on
// Fleet.Prefill prefill and Fleet.Decode decode workers, every request
// asking the router for a pair, and its other policies on an aggregated
// fleet of the same size. The driver runs a split request's two legs as
// the gateway does (gateway/pd.go): the prefill leg with max_tokens 1 on
// the prefill worker, whose booking is freed when it answers; then the
// decode leg on the decode worker, which pulls the prompt blocks it does
// not hold (sim.Engine.Pull) and streams the reply.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// Fleet is a prefill/decode split of the workers; the zero value is an
// aggregated fleet (every worker both).
type Fleet struct {
	Prefill, Decode int
}

// Split reports whether f has roles.
func (f Fleet) Split() bool { return f.Prefill > 0 || f.Decode > 0 }

// String is f as ParseFleet reads it ("4p4d"; "" when aggregated).
func (f Fleet) String() string {
	if !f.Split() {
		return ""
	}
	return strconv.Itoa(f.Prefill) + "p" + strconv.Itoa(f.Decode) + "d"
}

// Roles are the workers' roles by index: the prefill workers first.
func (f Fleet) Roles() []workers.Role {
	out := make([]workers.Role, 0, f.Prefill+f.Decode)
	for range f.Prefill {
		out = append(out, workers.RolePrefill)
	}
	for range f.Decode {
		out = append(out, workers.RoleDecode)
	}
	return out
}

// ParseFleet reads NpMd (N prefill and M decode workers, both at least 1);
// "" is the aggregated fleet.
func ParseFleet(s string) (Fleet, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return Fleet{}, nil
	}
	p, d, ok := strings.Cut(strings.TrimSuffix(s, "d"), "p")
	np, err1 := strconv.Atoi(p)
	nd, err2 := strconv.Atoi(d)
	if !ok || !strings.HasSuffix(s, "d") || err1 != nil || err2 != nil || np < 1 || nd < 1 {
		return Fleet{}, fmt.Errorf("%w: fleet %q (want NpMd, e.g. 4p4d)", ErrConfig, s)
	}
	return Fleet{Prefill: np, Decode: nd}, nil
}

// PDPolicies is the order of a split-fleet comparison: KV-aware split, the
// aggregated fleet of the same size, round-robin pairing.
var PDPolicies = []string{"kvrouter-pd", "kvrouter", "round-robin-pd"}

// transferModel is the decode engines' transfer model at the run's block
// size: the default bytes per token (an 8B model in bf16) and the run's
// bandwidth (0 = the default).
func (c *Config) transferModel() sim.TransferModel {
	perToken := int64(sim.DefaultTransferBlockBytes / sim.DefaultBlockSize)
	return sim.TransferModel{BandwidthGBps: c.TransferGBps, BlockBytes: perToken * int64(c.BlockSize)}
}

// checkPD refuses what a split fleet cannot run: a PD policy without one,
// or one that needs what the split legs do not carry.
func (c *Config) checkPD() error {
	if c.Fleet.Split() && c.Fleet.Prefill+c.Fleet.Decode != c.Workers {
		return fmt.Errorf("%w: fleet %s is %d workers, not %d", ErrConfig, c.Fleet, c.Fleet.Prefill+c.Fleet.Decode, c.Workers)
	}
	if c.TransferGBps < 0 {
		return fmt.Errorf("%w: transfer bandwidth %g GB/s", ErrConfig, c.TransferGBps)
	}
	for _, p := range c.Policies {
		switch {
		case !p.PD:
		case !c.Fleet.Split():
			return fmt.Errorf("%w: policy %s needs a split fleet (--fleet NpMd)", ErrConfig, p.Name)
		case p.TrueCache || p.Peer:
			return fmt.Errorf("%w: policy %s cannot run split", ErrConfig, p.Name)
		}
	}
	return nil
}

// split runs the two legs of a split request (routed.Prefill set) and
// fills rec: TTFT is the router queue, the prefill leg (its engine's queue
// and compute), the transfer and the decode engine's time to first token.
// Both bookings are freed; the decode booking's prefill_done comes at the
// first token, as the gateway sends it.
func (d *driver) split(ctx context.Context, p *prepared, id string, routed *Routed, rec *metrics.Record) {
	pre := routed.Prefill
	rec.PrefillWorker, rec.RouterBlocks = pre.Worker, pre.Overlap
	g := p.generateRequest(id, d.blockTokens())
	g.MaxTokens, g.RemoteDecode = 1, true
	preReply, err := d.gen.Generate(ctx, pre.Endpoint, g, func() {})
	d.free(ctx, id, pre)
	if err != nil {
		d.generateFailed(ctx, id, routed, rec, err, "prefill_")
		return
	}
	g = p.generateRequest(id, d.blockTokens())
	g.RemoteBlocks = preReply.RemoteBlocks
	reply, err := d.gen.Generate(ctx, routed.Endpoint, g, d.firstToken(ctx, id, routed, nil))
	d.free(ctx, id, routed)
	if err != nil {
		d.generateFailed(ctx, id, nil, rec, err, "")
		return
	}
	bs := d.cfg.BlockSize
	wait := time.Duration(float64(routed.QueueWait) * d.cfg.Speedup)
	rec.PrefillLeg = msDur(preReply.E2EMs)
	rec.Transfer = msDur(reply.TransferMs)
	rec.TransferBlocks = reply.PulledBlocks
	rec.CachedBlocks = preReply.CachedTokens / bs
	rec.DecodeHeldBlocks = reply.CachedTokens / bs
	before := wait + rec.PrefillLeg + rec.Transfer
	rec.OutputTokens = reply.OutputTokens
	rec.TTFT = before + msDur(reply.TTFTMs)
	rec.ITL = msDur(reply.ITLMs)
	rec.E2E = before + msDur(reply.E2EMs)
	rec.Finish = p.req.Arrival + rec.E2E
	d.finish(*rec)
}

// generateFailed records a generate call's failure; routed, when not nil,
// is a booking still to free. prefix marks the leg ("prefill_" or "").
func (d *driver) generateFailed(ctx context.Context, id string, routed *Routed, rec *metrics.Record, err error, prefix string) {
	if routed != nil {
		d.free(ctx, id, routed)
	}
	rec.Outcome = metrics.Failed
	rec.Code = prefix + "generate"
	var re *sim.RemoteError
	if errors.As(err, &re) {
		rec.Code = prefix + "worker_" + re.Code
	}
	d.finish(*rec)
}
