package host

import (
	"context"
	"errors"
	"slices"
	"strconv"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workerref"
)

// lifecycleOps are the lifecycle calls a replica answers.
var lifecycleOps = []string{api.OpPrefillDone, api.OpFree, api.OpCancel, api.OpServeWhole}

// Lifecycle applies one lifecycle call (OpPrefillDone, OpFree, OpCancel, OpServeWhole)
// to a request booked by this replica. A call addressed to another replica
// (lr.Replica) is forwarded there over NATS. The call must prove it is the
// request's owner's (checkOwner).
func (r *Replica) Lifecycle(ctx context.Context, op string, lr *api.LifecycleRequest) (*api.LifecycleResponse, error) {
	return r.lifecycleCall(ctx, op, lr, lifecycleVia{})
}

// lifecycleVia says how a lifecycle call arrived.
type lifecycleVia struct {
	pooled bool // the caller holds a place in the forwarding pool already (a NATS call being forwarded)
	admin  bool // on the operator's subjects (api.AdminSubject): no fence is checked
}

// lifecycleCall is Lifecycle as it arrived (via).
func (r *Replica) lifecycleCall(ctx context.Context, op string, lr *api.LifecycleRequest, via lifecycleVia) (*api.LifecycleResponse, error) {
	if e := r.enter(); e != nil {
		return nil, e
	}
	defer r.leave()
	resp, err := r.lifecycle(ctx, op, lr, via)
	result := "ok"
	if err != nil {
		result = mapError(err).Code
	}
	r.m.lifecycleDone(ctx, op, result)
	return resp, err
}

func (r *Replica) lifecycle(ctx context.Context, op string, lr *api.LifecycleRequest, via lifecycleVia) (*api.LifecycleResponse, error) {
	if !slices.Contains(lifecycleOps, op) {
		return nil, api.BadField("op", "unknown lifecycle operation %q", op)
	}
	if lr.V != 0 && lr.V != api.APIVersion {
		return nil, api.BadField("v", "version %d is not supported (this replica speaks %d)", lr.V, api.APIVersion)
	}
	if lr.RequestID == "" {
		return nil, api.BadField("request_id", "is required")
	}
	if len(lr.RequestID) > api.MaxRequestIDLen {
		return nil, api.BadField("request_id", "is %d bytes long, the limit is %d", len(lr.RequestID), api.MaxRequestIDLen)
	}
	if len(lr.Fence) > api.MaxFenceLen {
		return nil, api.BadField("fence", "is %d bytes long, the limit is %d", len(lr.Fence), api.MaxFenceLen)
	}
	lr.Model = r.defaultModel(lr.Model)
	if lr.Replica != "" && lr.Replica != r.id {
		return r.forwardLifecycle(ctx, op, lr, via)
	}
	ms, e := r.model(lr.Model)
	if e != nil {
		return nil, e
	}
	fe, ok := ms.fences.get(lr.RequestID)
	if e := r.checkOwner(op, fe, ok, lr, via.admin); e != nil {
		return nil, e
	}
	var err error
	switch {
	case op == api.OpCancel && !ok:
		err = ms.sched.Cancel(lr.RequestID)
	case !ok:
		return nil, api.NewError(api.CodeNotFound, "request "+strconv.Quote(lr.RequestID)+" has no booking on replica "+r.id+" (model "+strconv.Quote(lr.Model)+")", nil).OnField("request_id")
	case op == api.OpPrefillDone:
		err = ms.sched.PrefillDone(fe)
	case op == api.OpServeWhole:
		err = ms.sched.ServeWhole(fe, true)
	default: // free, or cancel of a routed request
		err = ms.sched.Free(fe)
		ms.fences.del(fe)
	}
	if err != nil {
		if errors.Is(err, scheduler.ErrUnknownBooking) || errors.Is(err, scheduler.ErrUnknownRequest) || errors.Is(err, scheduler.ErrStaleFence) {
			ms.fences.del(fe)
			return nil, api.NewError(api.CodeNotFound, "request "+strconv.Quote(lr.RequestID)+": "+err.Error(), err).OnField("request_id")
		}
		return nil, err
	}
	return &api.LifecycleResponse{V: api.APIVersion, RequestID: lr.RequestID, Op: op, Replica: r.id}, nil
}

// Session returns a session's binding.
func (r *Replica) Session(ctx context.Context, model, session string) (*api.SessionResponse, error) {
	if e := r.enter(); e != nil {
		return nil, e
	}
	defer r.leave()
	model = r.defaultModel(model)
	if _, e := r.model(model); e != nil {
		return nil, e
	}
	if e := checkSession(session); e != nil {
		return nil, e
	}
	b, err := r.table.Get(ctx, model, session)
	if err != nil {
		if errors.Is(err, bindings.ErrNotFound) {
			return nil, api.NewError(api.CodeNotFound, "session "+strconv.Quote(session)+" of model "+strconv.Quote(model)+" has no binding", err).OnField("session_id")
		}
		return nil, err
	}
	return &api.SessionResponse{V: api.APIVersion, Model: model, SessionID: session, Worker: b.Worker, Rank: b.Rank, HasRank: !b.AnyRank,
		Mode: b.Mode.String(), Version: b.Version, Writer: b.Writer, Created: b.Created, Renewed: b.Renewed}, nil
}

// EndSession removes a session's binding.
func (r *Replica) EndSession(ctx context.Context, model, session string) error {
	if e := r.enter(); e != nil {
		return e
	}
	defer r.leave()
	model = r.defaultModel(model)
	if _, e := r.model(model); e != nil {
		return e
	}
	if e := checkSession(session); e != nil {
		return e
	}
	if err := r.table.End(ctx, model, session); err != nil {
		if errors.Is(err, bindings.ErrNotFound) {
			return api.NewError(api.CodeNotFound, "session "+strconv.Quote(session)+" of model "+strconv.Quote(model)+" has no binding", err).OnField("session_id")
		}
		return err
	}
	r.log.Debug("session ended", "model", model, "session", session)
	return nil
}

func checkSession(s string) *api.Error {
	switch {
	case s == "":
		return api.BadField("session_id", "is required")
	case len(s) > api.MaxSessionIDLen:
		return api.BadField("session_id", "is %d bytes long, the limit is %d", len(s), api.MaxSessionIDLen)
	}
	return nil
}

// Waiting is how many requests of model wait in this replica's queue now
// (0 for a model it does not route): what kvr_queue_depth reports.
func (r *Replica) Waiting(model string) int64 {
	ms, ok := r.models[r.defaultModel(model)]
	if !ok {
		return 0
	}
	return ms.sched.Stats().Waiting
}

// CachedShare is this replica's estimate of the share of the prompt blocks
// it routed lately for model that the chosen worker already held
// (scheduler.Stats.CachedShare: what kvr_scheduler_cached_share reports);
// 1 before the first selection and for a model it does not route.
func (r *Replica) CachedShare(model string) float64 {
	ms, ok := r.models[r.defaultModel(model)]
	if !ok {
		return 1
	}
	return ms.sched.Stats().CachedShare
}

// Workers lists the workers of one model (every model when model is "")
// with this replica's predicted load and index size per rank.
func (r *Replica) Workers(model string) (*api.WorkersResponse, error) {
	out := &api.WorkersResponse{V: api.APIVersion, Replica: r.id, Workers: []api.WorkerStatus{}}
	names := r.modelList
	if model != "" {
		if _, e := r.model(model); e != nil {
			return nil, e
		}
		names = []string{model}
	}
	for _, name := range names {
		ms := r.models[name]
		loads := map[workerref.Target]api.PredictedLoad{}
		all, _ := ms.sched.Loads(context.Background())
		for _, l := range all {
			loads[workerKeyOf(l.Key.Worker, l.Key.Rank)] = api.PredictedLoad{
				ActiveRequests: l.ActiveRequests, PrefillTokens: l.PrefillTokens, DecodeBlocks: l.DecodeBlocks}
		}
		for _, w := range ms.workerList() {
			for _, rank := range w.Ranks {
				ws := api.WorkerStatus{Worker: w.ID, Rank: rank, Model: w.Model, Endpoint: w.Endpoint, State: string(w.State),
					BlockSize: w.BlockSize, KVBlocks: w.KVBlocks, MaxBatchedTokens: w.MaxBatchedTokens, MaxSeqs: w.MaxSeqs,
					Epoch: w.Epoch, Labels: w.Labels, IndexedBlocks: ms.index.WorkerBlocks(workerKeyOf(w.ID, rank)),
					Adapters: w.Adapters, LoadedAdapters: w.LoadedAdapters, MaxLoRAs: w.MaxLoRAs, Role: string(w.Role.Or())}
				if l, ok := loads[workerKeyOf(w.ID, rank)]; ok {
					ws.Load = &l
				}
				ws.Reported = ms.reportedStatus(workerKeyOf(w.ID, rank))
				out.Workers = append(out.Workers, ws)
			}
		}
	}
	return out, nil
}
