package host

import (
	"context"
	"errors"
	"time"
	"unsafe"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// routeScratch is the per-request memory of Route, pooled so that a route
// allocates little beyond what it must keep.
type routeScratch struct {
	req     api.RouteRequest
	resp    api.RouteResponse
	binding api.BindingInfo
	hashes  []kvevents.SeqHash
	ov      index.Overlaps
	pov     index.Overlaps
	sov     []scheduler.Overlap
	holders []string // workers holding the request's LoRA adapter (adapters.go)
	sel     selection
	choose  bindings.Selector // sel.choose, bound once per scratch (a method value allocates)
	tel     routeTelemetry
	out     []byte
}

func (r *Replica) getScratch() *routeScratch {
	if s, ok := r.scratch.Get().(*routeScratch); ok {
		return s
	}
	s := &routeScratch{}
	s.choose = s.sel.choose
	return s
}

func (r *Replica) putScratch(s *routeScratch) {
	s.req.Reset()
	s.resp = api.RouteResponse{}
	s.binding = api.BindingInfo{}
	s.sel = selection{}
	s.tel = routeTelemetry{}
	if cap(s.out) > 1<<20 {
		s.out = nil
	}
	r.scratch.Put(s)
}

// Route decides where one request goes: validate, hash, look up the prefix
// index (and the predicted index), read and commit the session binding
// around the scheduler's decision, and fill resp. It is what both
// transports call. ctx carries the caller's trace context.
func (r *Replica) Route(ctx context.Context, req *api.RouteRequest, resp *api.RouteResponse) error {
	// In-process callers (serve --openai-addr) count against MaxInFlight
	// like the NATS and HTTP transports, which admit before r.route.
	if e := r.admitRoute(); e != nil {
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		return e
	}
	defer r.leaveRoute()
	s := r.getScratch()
	defer r.putScratch(s)
	err := r.route(ctx, req, resp, s)
	if resp.Binding != nil {
		// The binding info lives in the pooled scratch: give the caller
		// its own copy.
		b := *resp.Binding
		resp.Binding = &b
	}
	return err
}

// route is one request's life: lookup -> requirement -> select (and commit
// the session binding) -> commit the booking -> reply. A request without a
// session is the same selection with no binding requirement. Telemetry
// (s.tel) records each step and costs nothing when no span records.
//
// One deadline (deadline_ms, else Config.DefaultDeadline, from arrival)
// bounds the whole route: the scheduler's queue wait, and for a session the
// binding read and commit too (ctx), so a bindings leader that cannot
// answer gives bindings_unavailable instead of a hung request. A request
// without a session does no network I/O: the scheduler's deadline alone
// bounds it, and it needs no timer.
func (r *Replica) route(ctx context.Context, req *api.RouteRequest, resp *api.RouteResponse, s *routeScratch) (err error) {
	t0 := time.Now()
	ctx = s.tel.start(ctx, r)
	defer func() { err = s.tel.end(ctx, err) }()

	ms, mode, e := r.validate(req)
	if e != nil {
		return e
	}
	if req.SessionID != "" {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, t0.Add(r.deadlineOf(req)))
		defer cancel()
	}
	if req.RequestID == "" {
		req.RequestID = r.newRequestID(s)
	}
	s.tel.request(req)

	hashes, tokens := r.lookup(ms, req, s)
	sel := s.sel.begin(r, ms, &s.tel, r.requirement(req, hashes, tokens, t0, s))
	ms.adapterRequirement(req, &sel.req, s)
	if req.PD {
		if err := r.bookPrefill(ctx, ms, req, s, !r.cfg.PDNoLocalPrefill); err != nil {
			return err
		}
	}
	res, err := r.selectAndBind(ctx, req, mode, s)
	if err != nil && s.sel.localPrefill() && errors.Is(err, scheduler.ErrWouldQueue) {
		// No decode worker has room for the prompt either: the pair
		// waits for a prefill worker, as without the rule.
		s.sel.endLocalPrefill()
		if err = r.bookPrefill(ctx, ms, req, s, false); err == nil {
			res, err = r.selectAndBind(ctx, req, mode, s)
		}
	}
	if err != nil {
		sel.release()
		sel.releasePrefill()
		return err
	}
	r.commit(ms, &sel.dec, hashes, t0)
	r.reply(ctx, ms, req, resp, &sel.dec, res, s)
	if req.PD {
		r.completePD(ctx, ms, req, resp, s, hashes, t0)
	}
	return nil
}

// lookup hashes the prompt (or takes the caller's hashes) and looks it up
// in the model's indexes into s.sov (modelState.overlaps).
func (r *Replica) lookup(ms *modelState, req *api.RouteRequest, s *routeScratch) ([]kvevents.SeqHash, int) {
	t0 := time.Now()
	hashes, tokens := r.promptHashes(ms, req, s)
	s.sov = ms.overlaps(hashes, &s.ov, &s.pov, s.sov[:0])
	s.tel.lookedUp(t0, len(hashes), &s.ov, &s.pov)
	return hashes, tokens
}

// requirement is the scheduler request of req: its prompt and overlaps,
// deadline, eligibility, pin and (Soft) preference. A session binding, when
// there is one, replaces the preference at selection time.
func (r *Replica) requirement(req *api.RouteRequest, hashes []kvevents.SeqHash, tokens int, t0 time.Time, s *routeScratch) scheduler.Request {
	deadline := r.deadlineOf(req)
	allowed := req.AllowedWorkers
	if len(allowed) == 0 {
		allowed = nil // absent: every worker (an empty, reused slice would mean none)
	}
	sr := scheduler.Request{
		ID: req.RequestID, Model: req.Model, SeqHashes: hashes, Tokens: tokens,
		ExpectedOutput: req.ExpectedOutputTokens, Priority: req.Priority, Allowed: allowed,
		SessionID: req.SessionID, RoutingKey: req.RoutingKey, Deadline: t0.Add(deadline), Overlaps: s.sov,
	}
	if req.PD {
		sr.Leg = scheduler.LegDecode
	}
	if req.Pin != nil {
		s.sel.pin = req.Pin.Target()
		sr.Pinned = &s.sel.pin
	}
	if req.Prefer != nil {
		s.sel.prefer = scheduler.Affinity{Target: req.Prefer.Target(), Mode: session.Soft}
	}
	return sr
}

// deadlineOf is how long req may take from its arrival: deadline_ms, or
// Config.DefaultDeadline when it gives none.
func (r *Replica) deadlineOf(req *api.RouteRequest) time.Duration {
	if req.DeadlineMS > 0 {
		return time.Duration(req.DeadlineMS) * time.Millisecond
	}
	return r.cfg.DefaultDeadline
}

// requestMode is the binding mode a request asks for: "" (absent) is
// session.Unset, the table's default (serve --session-mode); anything
// session.ParseMode refuses is a bad session_mode. The bindings table
// applies it only to a binding the request creates: the mode stored in an
// existing binding wins (bindings.Table.RouteMode).
func requestMode(s string) (session.Mode, *api.Error) {
	if s == "" {
		return session.Unset, nil
	}
	m, err := session.ParseMode(s)
	if err != nil {
		return session.Unset, api.BadField("session_mode", "%v", err)
	}
	return m, nil
}

// selectAndBind selects a worker: directly for a request without a
// session, through the bindings table (which reads the binding, calls the
// selection with it as the requirement and commits the outcome) for one
// with a session.
func (r *Replica) selectAndBind(ctx context.Context, req *api.RouteRequest, mode session.Mode, s *routeScratch) (bindings.Result, error) {
	if req.SessionID == "" {
		_, err := s.choose(ctx, nil)
		return bindings.Result{}, err
	}
	s.tel.binding()
	res, err := r.table.RouteMode(ctx, req.Model, req.SessionID, mode, s.choose)
	s.tel.bound(&res)
	if err != nil && s.sel.schedErr == nil && bindingsUnanswered(err) {
		err = &bindingsUnavailableError{session: req.SessionID, err: err}
	}
	if err == nil && !s.sel.booked {
		err = api.NewError(api.CodeInternal, "binding commit returned without a selection", nil)
	}
	return res, err
}

// commit keeps the booking of the chosen worker (its fence answers the
// lifecycle calls) and records the decision for the predicted index, this
// replica's and its peers'.
func (r *Replica) commit(ms *modelState, dec *scheduler.Decision, hashes []kvevents.SeqHash, t0 time.Time) {
	ms.fences.put(dec.Fence)
	ms.recordPredicted(dec.Worker, hashes, t0)
	r.share.shareDecision(ms, dec.Worker, hashes)
}

// reply fills resp with the decision (and the binding outcome of a
// session) and records the route's metrics.
func (r *Replica) reply(ctx context.Context, ms *modelState, req *api.RouteRequest, resp *api.RouteResponse, dec *scheduler.Decision, res bindings.Result, s *routeScratch) {
	nblocks := len(s.sel.req.SeqHashes)
	*resp = api.RouteResponse{
		V: api.APIVersion, RequestID: req.RequestID, Model: req.Model, Worker: dec.Worker.Worker, Rank: dec.Worker.Rank,
		Endpoint: ms.endpoint(dec.Worker.Worker), OverlapBlocks: dec.OverlapBlocks, PromptBlocks: nblocks,
		Attempt: dec.Fence.Attempt, Fence: r.signer.token(dec.Fence), Replica: r.id, QueueWaitUS: dec.Waited.Microseconds(),
	}
	if req.SessionID != "" {
		r.m.outcome(ctx, res.Outcome.String())
		s.binding = api.BindingInfo{SessionID: req.SessionID, Outcome: res.Outcome.String(), Mode: res.Binding.Mode.String(),
			Worker: res.Binding.Worker, Rank: res.Binding.Rank, HasRank: !res.Binding.AnyRank, Version: res.Binding.Version}
		resp.Binding = &s.binding
	}
	if nblocks > 0 {
		r.m.overlapRatio.Record(ctx, float64(dec.OverlapBlocks)/float64(nblocks))
	}
	r.m.queueWait.Record(ctx, dec.Waited.Seconds())
	s.tel.routed(dec)
}

// selection is one request's scheduling across the bindings table's calls
// of choose (a lost create or a concurrent re-bind makes it select again).
// It holds at most one booking: the latest selection's.
type selection struct {
	r      *Replica
	ms     *modelState
	tel    *routeTelemetry
	req    scheduler.Request
	pin    workerref.Target
	prefer scheduler.Affinity // the wire preference (Soft)
	bind   scheduler.Affinity // the session binding's requirement
	dec    scheduler.Decision
	booked bool
	// The prefill leg of a PD route (pd.go), booked before the decode leg.
	pre       scheduler.Decision
	preBooked bool
	preWaited time.Duration // the prefill leg's queue wait
	// schedErr is the scheduler's error, when a selection failed: the
	// bindings table passes it on, and it is not the table's failure.
	schedErr error
}

// begin sets the selection up for one request and returns it.
func (sel *selection) begin(r *Replica, ms *modelState, tel *routeTelemetry, req scheduler.Request) *selection {
	sel.r, sel.ms, sel.tel, sel.req = r, ms, tel, req
	return sel
}

// choose is the bindings.Selector: schedule the request under the
// binding's requirement q (nil: unbound or no session) and keep the
// booking. The pin and the binding go to the scheduler unchanged: its pin
// rule alone decides whether they agree.
func (sel *selection) choose(ctx context.Context, q *bindings.Requirement) (workerref.Target, error) {
	sel.release() // a superseded selection's booking
	sel.req.Affinity = nil
	if sel.prefer.Target.Worker != "" {
		sel.req.Affinity = &sel.prefer
	}
	if q != nil {
		sel.bind = scheduler.Affinity{Target: q.Target, Mode: q.Mode}
		sel.req.Affinity = &sel.bind
	}
	t0 := time.Now()
	d, err := sel.ms.sched.Schedule(ctx, &sel.req)
	if err != nil {
		sel.schedErr = err
		if q != nil && sel.req.Pinned != nil && errors.Is(err, scheduler.ErrPinConflict) {
			return workerref.Target{}, &pinBindingError{pin: *sel.req.Pinned, session: sel.req.SessionID, binding: *q, err: err}
		}
		return workerref.Target{}, err
	}
	sel.dec, sel.booked = d, true
	sel.tel.scheduled(t0, &sel.dec)
	return workerref.Of(d.Worker.Worker, d.Worker.Rank), nil
}

// release gives back the selection's booking, if it holds one: a selection
// superseded by another, or a request that ends in an error.
func (sel *selection) release() {
	if sel.booked {
		sel.r.rollback(sel.ms, sel.dec.Fence)
		sel.booked = false
	}
}

// releasePrefill gives back the prefill leg's booking, if it holds one.
func (sel *selection) releasePrefill() {
	if sel.preBooked {
		sel.r.rollback(sel.ms, sel.pre.Fence)
		sel.preBooked = false
	}
}

// rollback releases a booking that will not be used.
func (r *Replica) rollback(ms *modelState, f scheduler.Fence) {
	if err := ms.sched.Rollback(f); err != nil {
		r.log.Debug("rollback", "fence", f.String(), "err", err)
	}
	ms.fences.del(f)
}

// promptHashes returns the prompt's sequence hashes (computed from token ids
// and media items into scratch, or the caller's precomputed ones) and its
// token count. With a media item whose identifier is unknown the hashes
// stop before it: the prompt blocks the route reports are the ones it can
// know.
func (r *Replica) promptHashes(ms *modelState, req *api.RouteRequest, s *routeScratch) ([]kvevents.SeqHash, int) {
	if len(req.TokenIDs) > 0 {
		s.hashes = req.SeqHashes(s.hashes[:0], ms.blockSize)
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
// model's block size. Errors name the field. It returns the model and the
// session mode the request asks for.
func (r *Replica) validate(req *api.RouteRequest) (*modelState, session.Mode, *api.Error) {
	if req.V != 0 && req.V != api.APIVersion {
		return nil, session.Unset, api.BadField("v", "version %d is not supported (this replica speaks %d)", req.V, api.APIVersion)
	}
	ms, e := r.model(req.Model)
	if e != nil {
		return nil, session.Unset, e
	}
	switch {
	case len(req.TokenIDs) > 0 && len(req.BlockHashes) > 0:
		return nil, session.Unset, api.BadField("token_ids", "give either token_ids or block_hashes, not both")
	case len(req.TokenIDs) == 0 && len(req.BlockHashes) == 0 && req.InputTokens == 0:
		return nil, session.Unset, api.BadField("token_ids", "the prompt is required: give token_ids, block_hashes or (to route on load alone) input_tokens")
	case len(req.BlockHashes) > 0 && req.BlockSize == 0:
		return nil, session.Unset, api.BadField("block_size", "is required with block_hashes (model %q uses %d)", req.Model, ms.blockSize)
	case req.BlockSize != 0 && req.BlockSize != ms.blockSize:
		return nil, session.Unset, api.BadField("block_size", "%d does not match model %q's block size %d", req.BlockSize, req.Model, ms.blockSize)
	case req.InputTokens < 0:
		return nil, session.Unset, api.BadField("input_tokens", "must not be negative")
	case len(req.BlockHashes) > 0 && req.InputTokens > 0 && req.InputTokens < len(req.BlockHashes)*ms.blockSize:
		return nil, session.Unset, api.BadField("input_tokens", "%d is less than %d blocks of %d tokens", req.InputTokens, len(req.BlockHashes), ms.blockSize)
	case req.ExpectedOutputTokens < 0:
		return nil, session.Unset, api.BadField("expected_output_tokens", "must not be negative")
	case req.DeadlineMS < 0:
		return nil, session.Unset, api.BadField("deadline_ms", "must not be negative")
	case req.Pin != nil && req.Prefer != nil:
		return nil, session.Unset, api.BadField("prefer", "pin and prefer are exclusive: a pin is already exact")
	case len(req.SessionID) > api.MaxSessionIDLen:
		return nil, session.Unset, api.BadField("session_id", "is %d bytes long, the limit is %d", len(req.SessionID), api.MaxSessionIDLen)
	}
	mode, e := requestMode(req.SessionMode)
	if e != nil {
		return nil, session.Unset, e
	}
	if e := req.CheckMedia(); e != nil {
		return nil, session.Unset, e
	}
	if req.Pin != nil && req.Pin.Worker == "" {
		return nil, session.Unset, api.BadField("pin.worker", "is required")
	}
	if req.Prefer != nil && req.Prefer.Worker == "" {
		return nil, session.Unset, api.BadField("prefer.worker", "is required")
	}
	for i, w := range req.AllowedWorkers {
		if w == "" {
			return nil, session.Unset, api.BadField("allowed_workers", "entry %d is empty", i)
		}
	}
	if limit := api.MaxRequestIDLen - pdSuffixLen(req.PD); len(req.RequestID) > limit {
		return nil, session.Unset, api.BadField("request_id", "is %d bytes long, the limit is %d", len(req.RequestID), limit)
	}
	return ms, mode, nil
}
