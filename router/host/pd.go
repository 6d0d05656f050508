package host

import (
	"context"
	"errors"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// A route that asks for a prefill/decode pair (RouteRequest.PD, docs/pd.md)
// makes two decisions, the prefill leg's first. bookPrefill selects and
// books it: LegPrefill candidates (prefill and both workers) under the
// default cost (cached prefix against prefill queue), with no binding and
// no pin, under its own request id. Then the decode leg is the route's
// ordinary selection: LegDecode candidates (decode and both workers), the
// decode cost, the session's binding and the pin rule, committed and
// replied as any route. completePD applies the single-worker rule last.
//
// The prefill leg goes first so that a pair is admitted only when a
// prefill worker has room: when the prefill side is the bottleneck the
// request waits in the router queue holding nothing, instead of holding a
// decode booking (decode blocks and a running request on a worker that
// does nothing for it yet) that makes the decode side look busy too. A
// prefill leg that cannot be booked in time fails the route like any
// route; only a fleet with no prefill-capable worker at all sends the
// request whole to the decode worker, and the local prefill rule
// (bookPrefill) one whose prefill side is busy while a decode worker has
// room.

// bookPrefill books the prefill leg of a PD route into s.sel.pre. With no
// prefill-capable worker to take it (none registered, eligible or large
// enough) it books nothing and the route is served whole; any other
// scheduler error (the deadline, a queue limit, ctx) is the route's.
//
// local applies THE LOCAL PREFILL RULE: where the prefill leg would wait
// (every prefill worker busy by the queue threshold) it books nothing, and
// the decode leg is selected as a whole request that may not wait either
// (Request.NoWait): a decode-capable worker with room for the prompt's
// prefill serves it whole (prefill_busy). Where none has room, Route books
// the prefill leg again without the rule, and the pair waits as before.
// The queue threshold is what "room" means on both sides, so a decode
// worker takes local prefills only up to the prefill load a prefill worker
// would accept.
func (r *Replica) bookPrefill(ctx context.Context, ms *modelState, req *api.RouteRequest, s *routeScratch, local bool) error {
	pr := s.sel.req
	pr.ID, pr.Leg, pr.ExpectedOutput = req.RequestID+api.PrefillSuffix, scheduler.LegPrefill, 1
	pr.Pinned, pr.Affinity, pr.SessionID, pr.NoWait = nil, nil, "", local
	w0 := time.Now()
	d, err := ms.sched.Schedule(ctx, &pr)
	switch {
	case err == nil:
		s.sel.pre, s.sel.preBooked, s.sel.preWaited = d, true, d.Waited
	case local && errors.Is(err, scheduler.ErrWouldQueue):
		s.sel.req.Leg, s.sel.req.NoWait = scheduler.LegWhole, true
	case errors.Is(err, scheduler.ErrNoEligibleWorker), errors.Is(err, scheduler.ErrNoCandidate),
		errors.Is(err, scheduler.ErrExceedsCapacity):
		r.log.Debug("prefill leg not booked: the decode worker serves alone", "request", req.RequestID, "err", err)
		s.sel.preWaited = time.Since(w0)
	default:
		return err
	}
	return nil
}

// localPrefill reports that the local prefill rule is trying the decode
// side as a whole request: only the rule makes the route's own request
// one that may not wait.
func (sel *selection) localPrefill() bool { return sel.req.NoWait }

// endLocalPrefill returns the selection to an ordinary decode leg after
// the local prefill rule found no decode worker with room.
func (sel *selection) endLocalPrefill() {
	sel.req.Leg, sel.req.NoWait = scheduler.LegDecode, false
	sel.schedErr = nil
}

// completePD ends a PD route after the decode leg is committed and
// replied: the request splits (the prefill leg's booking is committed and
// the decode booking charged no prefill) unless the single-worker rule
// says the decode worker serves it whole, or no prefill leg was booked, or
// the prefill leg chose the decode worker itself.
func (r *Replica) completePD(ctx context.Context, ms *modelState, req *api.RouteRequest, resp *api.RouteResponse,
	s *routeScratch, hashes []kvevents.SeqHash, t0 time.Time) {
	dec, pre := &s.sel.dec, &s.sel.pre
	// The route's queue wait is both legs': a client adds it to the legs'
	// own times for the request's TTFT.
	resp.QueueWaitUS += s.sel.preWaited.Microseconds()
	reason := api.PDReasonNoPrefill
	if s.sel.localPrefill() {
		reason = api.PDReasonPrefillBusy
	}
	if s.sel.preBooked {
		reason = r.singleReason(ms, dec, s.sel.req.Tokens)
		if reason == "" && pre.Worker.Worker == dec.Worker.Worker {
			reason = api.PDReasonSame
		}
	}
	if reason != "" {
		s.sel.releasePrefill()
		r.serveWhole(ms, dec.Fence, true) // the decode worker computes the prompt
		resp.PD, resp.PDReason = api.PDSingle, reason
		r.m.pdRoute(ctx, api.PDSingle, reason)
		return
	}
	// The decode booking drops its prefill tokens (the decode engine pulls
	// the prompt) but is not marked prefill-done: the client's
	// prefill_done at the decode leg's first token restarts its expiry
	// clock, as a whole request's.
	r.commit(ms, pre, hashes, t0)
	s.sel.preBooked = false
	r.serveWhole(ms, dec.Fence, false)
	resp.PD = api.PDSplit
	resp.Prefill = &api.PrefillRoute{RequestID: req.RequestID + api.PrefillSuffix, Worker: pre.Worker.Worker, Rank: pre.Worker.Rank,
		Endpoint: ms.endpoint(pre.Worker.Worker), OverlapBlocks: pre.OverlapBlocks, Attempt: pre.Fence.Attempt,
		Fence: r.signer.token(pre.Fence), BootstrapPort: ms.bootstrapPort(pre.Worker.Worker)}
	r.m.pdRoute(ctx, api.PDSplit, "")
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
