package host

import (
	"context"
	"errors"
	"strconv"
	"time"
	"unsafe"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// routeScratch is the per-request memory of Route, pooled so that a route
// allocates little beyond what it must keep.
type routeScratch struct {
	req     RouteRequest
	resp    RouteResponse
	binding BindingInfo
	hashes  []kvevents.SeqHash
	ov      index.Overlaps
	pov     index.Overlaps
	sov     []scheduler.Overlap
	sreq    scheduler.Request
	pin     scheduler.Target
	aff     scheduler.Affinity
	out     []byte
	spanCtx context.Context // the route span's context, for the reply's trace headers
}

func (r *Replica) getScratch() *routeScratch {
	if s, ok := r.scratch.Get().(*routeScratch); ok {
		return s
	}
	return &routeScratch{}
}

func (r *Replica) putScratch(s *routeScratch) {
	s.req.Reset()
	s.resp = RouteResponse{}
	s.binding = BindingInfo{}
	s.sreq = scheduler.Request{}
	s.spanCtx = nil
	if cap(s.out) > 1<<20 {
		s.out = nil
	}
	r.scratch.Put(s)
}

// routeSpanOpts are the start options of the route span, built once.
var routeSpanOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// newRequestID returns "<replica>-<n>" (n in base 36) with one allocation.
func (r *Replica) newRequestID(s *routeScratch) string {
	b := append(s.out[:0], r.id...)
	b = append(b, '-')
	b = strconv.AppendUint(b, r.reqSeq.Add(1), 36)
	s.out = b
	return string(b)
}

// strengthOf is THE mapping from a session binding's mode to the strength
// of the scheduling requirement (the architecture's "one line in the host").
func strengthOf(m bindings.Mode) scheduler.Strength {
	if m == bindings.Soft {
		return scheduler.Soft
	}
	return scheduler.Hard
}

// Route decides where one request goes: validate, hash, look up the prefix
// index (and the predicted index), read and commit the session binding
// around the scheduler's decision, and fill resp. It is what both
// transports call. ctx carries the caller's trace context.
func (r *Replica) Route(ctx context.Context, req *RouteRequest, resp *RouteResponse) error {
	if e := r.enter(); e != nil {
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		return e
	}
	defer r.leave()
	s := r.getScratch()
	defer r.putScratch(s)
	return r.route(ctx, req, resp, s)
}

func (r *Replica) route(ctx context.Context, req *RouteRequest, resp *RouteResponse, s *routeScratch) (err error) {
	t0 := time.Now()
	// With no tracer configured, skip span creation entirely (it would
	// still allocate a context per request).
	var span trace.Span
	rec := false
	if r.tracing {
		ctx, span = r.tracer.Start(ctx, "kvrouter.route", routeSpanOpts...)
		rec = span.IsRecording()
		s.spanCtx = ctx
	}
	defer func() {
		code := "ok"
		if err != nil {
			e := asAPIError(err)
			err = e
			code = e.Code
			if e.Code == CodeBadRequest {
				r.m.badRequests.Add(ctx, 1, attr(fieldAttr(e.Field)))
			}
			if rec {
				span.SetStatus(codes.Error, e.Error())
				span.SetAttributes(attribute.String("kvr.error.code", e.Code))
			}
		}
		r.m.routeDone(ctx, code, time.Since(t0))
		if span != nil {
			span.End()
		}
	}()

	ms, e := r.validate(req)
	if e != nil {
		return e
	}
	if req.RequestID == "" {
		req.RequestID = r.newRequestID(s)
	}
	if rec {
		span.SetAttributes(attribute.String("kvr.model", req.Model), attribute.String("kvr.request_id", req.RequestID))
		if req.SessionID != "" {
			span.SetAttributes(attribute.String("kvr.session_id", req.SessionID))
		}
	}

	// Hash the prompt (or take the caller's hashes) and look up the index.
	tLookup := time.Now()
	hashes, tokens := r.promptHashes(ms, req, s)
	s.ov.Reset()
	switch {
	case ms.approx:
		ms.pred.Lookup(hashes, index.LookupOptions{}, &s.ov)
	default:
		ms.index.Lookup(hashes, index.LookupOptions{}, &s.ov)
	}
	if ms.pred != nil && !ms.approx {
		ms.pred.Lookup(hashes, index.LookupOptions{}, &s.pov)
		index.MergeMax(&s.ov, &s.pov)
	}
	s.sov = s.sov[:0]
	for _, w := range s.ov.Workers {
		s.sov = append(s.sov, scheduler.Overlap{Key: w.Key, Blocks: w.Blocks})
	}
	if rec {
		spanAt(ctx, r.tracer, "index.lookup", tLookup, time.Now(),
			attribute.Int("kvr.prompt_blocks", len(hashes)), attribute.Int("kvr.matched_blocks", s.ov.Total),
			attribute.Int("kvr.workers_matched", len(s.ov.Workers)))
	}

	deadline := r.cfg.DefaultDeadline
	if req.DeadlineMS > 0 {
		deadline = time.Duration(req.DeadlineMS) * time.Millisecond
	}
	allowed := req.AllowedWorkers
	if len(allowed) == 0 {
		allowed = nil // an empty, reused slice would mean "no worker allowed"
	}
	sr := &s.sreq
	*sr = scheduler.Request{
		ID: req.RequestID, Model: req.Model, SeqHashes: hashes, Tokens: tokens,
		ExpectedOutput: req.ExpectedOutputTokens, Priority: req.Priority, Allowed: allowed,
		SessionID: req.SessionID, Deadline: t0.Add(deadline), Overlaps: s.sov,
	}
	if req.Pin != nil {
		s.pin = scheduler.Target{Worker: req.Pin.Worker, Rank: req.Pin.Rank, HasRank: req.Pin.HasRank}
		sr.Pinned = &s.pin
	}
	// A wire preference is Soft; a session binding, when there is one,
	// takes the affinity slot instead (set by the selector below).
	var prefer *scheduler.Affinity
	if req.Prefer != nil {
		s.aff = scheduler.Affinity{Target: scheduler.Target{Worker: req.Prefer.Worker, Rank: req.Prefer.Rank, HasRank: req.Prefer.HasRank}, Strength: scheduler.Soft}
		prefer = &s.aff
	}
	sr.Affinity = prefer

	var dec scheduler.Decision
	var booked bool
	var res bindings.Result
	tSched := time.Now()
	if req.SessionID == "" {
		dec, err = ms.sched.Schedule(ctx, sr)
		if err != nil {
			return err
		}
		booked = true
		r.scheduleSpans(ctx, rec, tSched, &dec)
	} else {
		var tSelDone time.Time
		var bindAff scheduler.Affinity
		sel := func(ctx context.Context, q *bindings.Requirement) (bindings.Target, error) {
			// Bindings may select again (a lost create, a concurrent
			// re-bind): release the superseded booking first.
			if booked {
				r.rollback(ms, dec.Fence)
				booked = false
			}
			sr.Affinity = prefer
			if q != nil {
				bindAff = scheduler.Affinity{
					Target:   scheduler.Target{Worker: q.Target.Worker, Rank: q.Target.Rank, HasRank: q.Target.HasRank},
					Strength: strengthOf(q.Mode),
				}
				sr.Affinity = &bindAff
			}
			// The pin (sr.Pinned, as it came) and the binding go to the
			// scheduler unchanged: its pin rule alone decides whether they
			// agree, and rejects a disagreeing pair before selection.
			tS := time.Now()
			d, err := ms.sched.Schedule(ctx, sr)
			if err != nil {
				if q != nil && req.Pin != nil && errors.Is(err, scheduler.ErrPinConflict) {
					r.m.outcome(ctx, OutcomeConflict)
					return bindings.Target{}, &Error{Code: CodePinConflict, Status: statusOf(CodePinConflict), Field: "pin",
						Message: "pin " + refString(req.Pin) + " disagrees with session " + strconv.Quote(req.SessionID) +
							" bound (" + q.Mode.String() + ") to " + q.Target.String() + "; end the session or drop the pin",
						cause: err}
				}
				return bindings.Target{}, err
			}
			dec, booked = d, true
			r.scheduleSpans(ctx, rec, tS, &dec)
			tSelDone = time.Now()
			return bindings.Target{Worker: d.Worker.Worker, Rank: d.Worker.Rank, HasRank: true}, nil
		}
		res, err = r.table.Route(ctx, req.Model, req.SessionID, sel)
		if rec && !tSelDone.IsZero() {
			spanAt(ctx, r.tracer, "bindings.commit", tSelDone, time.Now(),
				attribute.String("kvr.binding.outcome", res.Outcome.String()),
				attribute.Int64("kvr.binding.revision", int64(res.Binding.Revision)),
				attribute.Int("kvr.binding.selections", res.Selections))
		}
		if err != nil {
			if booked {
				r.rollback(ms, dec.Fence)
			}
			var he *bindings.HardConflictError
			if errors.As(err, &he) {
				r.m.outcome(ctx, OutcomeRejected)
				return &Error{Code: CodeBindingRejected, Status: statusOf(CodeBindingRejected),
					Message: "session " + strconv.Quote(req.SessionID) + " is bound (hard) to live worker " + he.Bound.String() +
						", which cannot take the request now (selection picked " + he.Selected.String() + "); retry later or end the session",
					cause: err}
			}
			return err
		}
		if !booked {
			return newError(CodeInternal, "binding commit returned without a selection", nil)
		}
		r.m.outcome(ctx, res.Outcome.String())
		s.binding = BindingInfo{SessionID: req.SessionID, Outcome: res.Outcome.String(), Mode: res.Binding.Mode.String(),
			Worker: res.Binding.Worker, Rank: res.Binding.Rank, HasRank: res.Binding.HasRank, Version: res.Binding.Version}
		resp.Binding = &s.binding
	}

	ms.fences.put(dec.Fence)
	ms.recordPredicted(dec.Worker, hashes, t0)
	r.shareDecision(ms, dec.Worker, hashes)
	nblocks := len(hashes)
	resp.V = APIVersion
	resp.RequestID = req.RequestID
	resp.Model = req.Model
	resp.Worker = dec.Worker.Worker
	resp.Rank = dec.Worker.Rank
	resp.Endpoint = ms.endpoint(dec.Worker.Worker)
	resp.OverlapBlocks = dec.OverlapBlocks
	resp.PromptBlocks = nblocks
	resp.Attempt = dec.Fence.Attempt
	resp.Replica = r.id
	resp.QueueWaitUS = dec.Waited.Microseconds()
	if nblocks > 0 {
		r.m.overlapRatio.Record(ctx, float64(dec.OverlapBlocks)/float64(nblocks))
	}
	r.m.queueWait.Record(ctx, dec.Waited.Seconds())
	if rec {
		span.SetAttributes(attribute.String("kvr.worker", dec.Worker.String()), attribute.Int("kvr.overlap_blocks", dec.OverlapBlocks),
			attribute.Int64("kvr.attempt", int64(dec.Fence.Attempt)))
	}
	return nil
}

// scheduleSpans records the queue wait and the selection of one Schedule
// call as two child spans (the scheduler reports how long it waited).
func (r *Replica) scheduleSpans(ctx context.Context, rec bool, start time.Time, d *scheduler.Decision) {
	if !rec {
		return
	}
	end := time.Now()
	waitEnd := start.Add(d.Waited)
	if waitEnd.After(end) {
		waitEnd = end
	}
	spanAt(ctx, r.tracer, "scheduler.queue_wait", start, waitEnd)
	spanAt(ctx, r.tracer, "scheduler.select", waitEnd, end,
		attribute.String("kvr.policy", d.Policy), attribute.String("kvr.worker", d.Worker.String()),
		attribute.Bool("kvr.hard_fallback", d.HardFallback))
}

// rollback releases a booking that will not be used.
func (r *Replica) rollback(ms *modelState, f scheduler.Fence) {
	if err := ms.sched.Rollback(f); err != nil {
		r.log.Debug("rollback", "fence", f.String(), "err", err)
	}
	ms.fences.del(f)
}

func refString(w *WorkerRef) string {
	if w.HasRank {
		return w.Worker + "#" + strconv.FormatUint(uint64(w.Rank), 10)
	}
	return w.Worker
}

// promptHashes returns the prompt's sequence hashes (computed from token ids
// into scratch, or the caller's precomputed ones) and its token count.
func (r *Replica) promptHashes(ms *modelState, req *RouteRequest, s *routeScratch) ([]kvevents.SeqHash, int) {
	if len(req.TokenIDs) > 0 {
		seed := uint64(kvevents.HashSeed)
		if req.LoraName != "" || req.CacheSalt != "" {
			seed = kvevents.SeedFor(req.LoraName, req.CacheSalt)
		}
		s.hashes = kvevents.SeqHashes(s.hashes[:0], req.TokenIDs, ms.blockSize, seed)
		return s.hashes, len(req.TokenIDs)
	}
	// SeqHash is a uint64: reinterpret the caller's slice instead of
	// copying it.
	h := unsafe.Slice((*kvevents.SeqHash)(unsafe.SliceData(req.BlockHashes)), len(req.BlockHashes))
	tokens := req.InputTokens
	if tokens == 0 {
		tokens = len(h) * ms.blockSize
	}
	return h, tokens
}

// validate checks what the decoder cannot: presence, consistency, the
// model's block size. Errors name the field.
func (r *Replica) validate(req *RouteRequest) (*modelState, *Error) {
	if req.V != 0 && req.V != APIVersion {
		return nil, badField("v", "version %d is not supported (this replica speaks %d)", req.V, APIVersion)
	}
	ms, e := r.model(req.Model)
	if e != nil {
		return nil, e
	}
	switch {
	case len(req.TokenIDs) > 0 && len(req.BlockHashes) > 0:
		return nil, badField("token_ids", "give either token_ids or block_hashes, not both")
	case len(req.TokenIDs) == 0 && len(req.BlockHashes) == 0:
		return nil, badField("token_ids", "the prompt is required: give token_ids or block_hashes")
	case len(req.BlockHashes) > 0 && req.BlockSize == 0:
		return nil, badField("block_size", "is required with block_hashes (model %q uses %d)", req.Model, ms.blockSize)
	case req.BlockSize != 0 && req.BlockSize != ms.blockSize:
		return nil, badField("block_size", "%d does not match model %q's block size %d", req.BlockSize, req.Model, ms.blockSize)
	case req.InputTokens < 0:
		return nil, badField("input_tokens", "must not be negative")
	case len(req.BlockHashes) > 0 && req.InputTokens > 0 && req.InputTokens < len(req.BlockHashes)*ms.blockSize:
		return nil, badField("input_tokens", "%d is less than %d blocks of %d tokens", req.InputTokens, len(req.BlockHashes), ms.blockSize)
	case req.ExpectedOutputTokens < 0:
		return nil, badField("expected_output_tokens", "must not be negative")
	case req.DeadlineMS < 0:
		return nil, badField("deadline_ms", "must not be negative")
	case req.Pin != nil && req.Prefer != nil:
		return nil, badField("prefer", "pin and prefer are exclusive: a pin is already exact")
	case len(req.SessionID) > MaxSessionIDLen:
		return nil, badField("session_id", "is %d bytes long, the limit is %d", len(req.SessionID), MaxSessionIDLen)
	}
	if req.Pin != nil && req.Pin.Worker == "" {
		return nil, badField("pin.worker", "is required")
	}
	if req.Prefer != nil && req.Prefer.Worker == "" {
		return nil, badField("prefer.worker", "is required")
	}
	for i, w := range req.AllowedWorkers {
		if w == "" {
			return nil, badField("allowed_workers", "entry %d is empty", i)
		}
	}
	if len(req.RequestID) > MaxRequestIDLen {
		return nil, badField("request_id", "is %d bytes long, the limit is %d", len(req.RequestID), MaxRequestIDLen)
	}
	return ms, nil
}
