package host

import (
	"context"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// A route that asks for a prefill/decode pair (RouteRequest.PD, docs/pd.md)
// makes two decisions. The decode leg is the route's ordinary selection:
// LegDecode candidates (decode and both workers), the decode cost, the
// session's binding and the pin rule, committed and replied as any route.
// Then routePD applies the single-worker rule and, if the request splits,
// selects and books the prefill leg: LegPrefill candidates (prefill and
// both workers) under the default cost (cached prefix against prefill
// queue), with no binding and no pin, under its own request id.

// routePD completes a PD route after the decode leg is committed. It
// returns an error only when ctx ended while the prefill leg waited; the
// caller then releases the decode leg's booking.
func (r *Replica) routePD(ctx context.Context, ms *modelState, req *api.RouteRequest, resp *api.RouteResponse,
	s *routeScratch, hashes []kvevents.SeqHash, t0 time.Time) error {
	dec := &s.sel.dec
	reason := r.singleReason(ms, dec, s.sel.req.Tokens)
	if reason == "" {
		pr := s.sel.req
		pr.ID, pr.Leg, pr.ExpectedOutput = req.RequestID+api.PrefillSuffix, scheduler.LegPrefill, 1
		pr.Pinned, pr.Affinity, pr.SessionID = nil, nil, ""
		w0 := time.Now()
		d, err := ms.sched.Schedule(ctx, &pr)
		// The route's queue wait is both legs': a client adds it to the
		// legs' own times for the request's TTFT.
		waited := d.Waited
		if err != nil {
			waited = time.Since(w0)
		}
		resp.QueueWaitUS += waited.Microseconds()
		switch {
		case err != nil && ctx.Err() != nil:
			return err
		case err != nil:
			r.log.Debug("prefill leg not booked: the decode worker serves alone", "request", req.RequestID, "err", err)
			reason = api.PDReasonNoPrefill
		case d.Worker.Worker == dec.Worker.Worker:
			r.rollback(ms, d.Fence)
			reason = api.PDReasonSame
		default:
			// The decode booking drops its prefill tokens (the decode
			// engine pulls the prompt) but is not marked prefill-done:
			// the client's prefill_done at the decode leg's first token
			// restarts its expiry clock, as a whole request's.
			r.commit(ms, &d, hashes, t0)
			r.serveWhole(ms, dec.Fence, false)
			resp.PD = api.PDSplit
			resp.Prefill = &api.PrefillRoute{RequestID: pr.ID, Worker: d.Worker.Worker, Rank: d.Worker.Rank,
				Endpoint: ms.endpoint(d.Worker.Worker), OverlapBlocks: d.OverlapBlocks, Attempt: d.Fence.Attempt,
				Fence: r.signer.token(d.Fence), BootstrapPort: ms.bootstrapPort(d.Worker.Worker)}
			r.m.pdRoute(ctx, api.PDSplit, "")
			return nil
		}
	}
	r.serveWhole(ms, dec.Fence, true) // the decode worker computes the prompt
	resp.PD, resp.PDReason = api.PDSingle, reason
	r.m.pdRoute(ctx, api.PDSingle, reason)
	return nil
}

// serveWhole tells the scheduler whether the decode booking f serves the
// whole request (its worker's prefill load).
func (r *Replica) serveWhole(ms *modelState, f scheduler.Fence, whole bool) {
	if err := ms.sched.ServeWhole(f, whole); err != nil {
		r.log.Debug("decode booking", "fence", f.String(), "whole", whole, "err", err)
	}
}

// singleReason is THE SINGLE-WORKER RULE of a PD route: the decode worker
// chosen serves the whole request when it is a `both` worker and at most
// Config.PDSingleMaxTokens prompt tokens are uncached there (a short
// prompt, or a conversation whose decode worker holds nearly all of it):
// the transfer and the second engine's queue would cost more than the
// prefill they save. "" = split.
func (r *Replica) singleReason(ms *modelState, dec *scheduler.Decision, tokens int) string {
	if r.cfg.PDSingleMaxTokens < 0 {
		return ""
	}
	info, ok := (*ms.workers.Load())[dec.Worker.Worker]
	if !ok || info.Role.Or() != workers.RoleBoth {
		return ""
	}
	if tokens-dec.OverlapBlocks*ms.blockSize <= r.cfg.PDSingleMaxTokens {
		return api.PDReasonShort
	}
	return ""
}

// bootstrapPort is a worker's registered SGLang bootstrap port (0 = none).
func (ms *modelState) bootstrapPort(worker string) int {
	return (*ms.workers.Load())[worker].BootstrapPort
}

// pdRoute counts one PD route by mode and single-worker reason.
func (x *metrics) pdRoute(ctx context.Context, mode, reason string) {
	x.pdRoutes.Add(ctx, 1, metric.WithAttributes(attribute.String("mode", mode), attribute.String("reason", reason)))
}

// pdSuffixLen is how much of the request id limit a PD route keeps for the
// prefill leg's id.
func pdSuffixLen(pd bool) int {
	if pd {
		return len(api.PrefillSuffix)
	}
	return 0
}
