package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
)

// sessionTimeout bounds a session read or end.
const sessionTimeout = 10 * time.Second

// subscribeAPI joins the queue group of every API subject (once the replica
// is caught up, so clients never reach a replica that is not ready) and
// subscribes the replica-addressed lifecycle subjects.
func (r *Replica) subscribeAPI() error {
	qs := func(subject string, h nats.MsgHandler) error {
		s, err := r.nc.QueueSubscribe(subject, r.cfg.QueueGroup, h)
		if err != nil {
			return fmt.Errorf("host: subscribe %s: %w", subject, err)
		}
		// A burst must not be dropped as a slow consumer: the in-flight
		// bound (MaxInFlight) is what sheds load, with a clear 529.
		_ = s.SetPendingLimits(-1, 512<<20)
		r.apiSubs = append(r.apiSubs, s)
		return nil
	}
	for _, name := range r.modelList {
		if err := qs(api.RouteSubject(r.cfg.Prefix, name), r.onRouteMsg); err != nil {
			return err
		}
		for _, op := range lifecycleOps {
			if err := qs(api.LifecycleSubject(r.cfg.Prefix, op, name), r.lifecycleHandler(op, false)); err != nil {
				return err
			}
			if err := qs(api.AdminSubject(r.cfg.Prefix, op, name), r.lifecycleHandler(op, true)); err != nil {
				return err
			}
		}
		if err := qs(api.WorkersSubject(r.cfg.Prefix, name), r.onWorkersMsg(name)); err != nil {
			return err
		}
		if err := qs(api.SessionGetSubject(r.cfg.Prefix, name), r.onSessionMsg(name, false)); err != nil {
			return err
		}
		if err := qs(api.SessionEndSubject(r.cfg.Prefix, name), r.onSessionMsg(name, true)); err != nil {
			return err
		}
	}
	for _, op := range lifecycleOps {
		for _, admin := range []bool{false, true} {
			subject := api.ReplicaSubject(r.cfg.Prefix, r.id, op)
			if admin {
				subject = api.AdminReplicaSubject(r.cfg.Prefix, r.id, op)
			}
			s, err := r.nc.Subscribe(subject, r.lifecycleHandler(op, admin))
			if err != nil {
				return fmt.Errorf("host: subscribe replica lifecycle %s: %w", subject, err)
			}
			_ = s.SetPendingLimits(-1, 512<<20)
			// Replica-addressed calls must keep being answered while
			// draining (the bookings they release are still ours), so
			// they are drained with the API subscriptions.
			r.apiSubs = append(r.apiSubs, s)
		}
	}
	return r.nc.Flush()
}

// admitRoute admits one route request on either transport, or says why
// not: past MaxInFlight requests in flight (NATS and HTTP together) it is
// a 529 at once. leaveRoute ends an admitted one.
func (r *Replica) admitRoute() *api.Error {
	return r.admitTo(r.sem, func() *api.Error {
		return api.NewError(api.CodeOverloaded, "replica "+r.id+" has "+strconv.Itoa(r.cfg.MaxInFlight)+" requests in flight (max in flight)", nil)
	})
}

func (r *Replica) leaveRoute() { r.leaveFrom(r.sem) }

// admitTo admits one call past the replica's gate (enter) and into the
// bounded pool sem, or answers full()'s error at once when the pool is
// full. leaveFrom ends an admitted call.
func (r *Replica) admitTo(sem chan struct{}, full func() *api.Error) *api.Error {
	if e := r.enter(); e != nil {
		return e
	}
	select {
	case sem <- struct{}{}:
		return nil
	default:
		r.leave()
		return full()
	}
}

func (r *Replica) leaveFrom(sem chan struct{}) {
	<-sem
	r.leave()
}

// onRouteMsg runs each route request on its own goroutine, so requests
// waiting in the scheduler queue never hold up others, bounded by
// MaxInFlight; beyond it the request is answered 529 at once.
func (r *Replica) onRouteMsg(m *nats.Msg) {
	// Admit in the subscription's callback, so that every message a
	// draining subscription hands over is counted before Close waits.
	if e := r.admitRoute(); e != nil {
		r.m.routes.Add(context.Background(), 1, r.m.codeOpt(e.Code))
		r.replyError(m, nil, e)
		return
	}
	r.routes.run(m)
}

// serveRoute is the route pool's handler: an admitted message.
func (r *Replica) serveRoute(m *nats.Msg) {
	defer r.leaveRoute()
	r.handleRoute(m)
}

// handleRoute answers one route message; the caller has admitted it.
func (r *Replica) handleRoute(m *nats.Msg) {
	ctx := context.Background()
	if len(m.Header) > 0 {
		ctx = r.prop.Extract(ctx, api.HeaderCarrier(m.Header))
	}
	s := r.getScratch()
	defer r.putScratch(s)
	if limit := r.routeBodyLimit(); int64(len(m.Data)) > limit {
		e := api.BadField("body", "is %d bytes, the limit is %d", len(m.Data), limit)
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		r.replyError(m, ctx, e)
		return
	}
	if err := api.DecodeRouteRequest(m.Data, &s.req); err != nil {
		e := mapError(err)
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		r.replyError(m, ctx, e)
		return
	}
	spanCtx, err := r.routeTraced(ctx, &s.req, &s.resp, s)
	if err != nil {
		r.replyError(m, spanCtx, mapError(err))
		return
	}
	s.out = api.AppendRouteResponse(s.out[:0], &s.resp)
	if sc := trace.SpanContextFromContext(spanCtx); sc.IsValid() {
		reply := &nats.Msg{Subject: m.Reply, Data: s.out, Header: nats.Header{}}
		r.prop.Inject(spanCtx, api.HeaderCarrier(reply.Header))
		err = r.nc.PublishMsg(reply)
	} else {
		err = r.nc.Publish(m.Reply, s.out) // no header: no message to allocate
	}
	if err != nil {
		// The client will never learn where to go: release the booking.
		r.rollbackReply(&s.resp)
		r.log.Debug("route reply not sent; booking rolled back", "request_id", s.resp.RequestID, "err", err)
	}
}

// routeTraced is route also returning the context of the route span (ctx
// when not tracing), so the reply can carry its trace context.
func (r *Replica) routeTraced(ctx context.Context, req *api.RouteRequest, resp *api.RouteResponse, s *routeScratch) (context.Context, error) {
	err := r.route(ctx, req, resp, s)
	if s.tel.ctx != nil {
		ctx = s.tel.ctx
	}
	return ctx, err
}

// rollbackReply releases the booking of a route answer that could not be
// delivered: the client will not use it.
func (r *Replica) rollbackReply(resp *api.RouteResponse) {
	if ms, ok := r.models[resp.Model]; ok {
		if fe, ok := ms.fences.get(resp.RequestID); ok {
			r.rollback(ms, fe)
		}
	}
}

// replyError answers m with an error envelope and the Kvr-Status header.
// Every error a NATS client gets passes here, so bad requests are counted
// here (fire-and-forget calls included).
func (r *Replica) replyError(m *nats.Msg, ctx context.Context, e *api.Error) {
	if ctx == nil {
		ctx = context.Background()
	}
	r.countBad(ctx, e)
	if m.Reply == "" {
		return
	}
	reply := &nats.Msg{Subject: m.Reply, Header: nats.Header{}, Data: api.AppendError(nil, e)}
	reply.Header.Set(api.HeaderStatus, strconv.Itoa(e.Status))
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.prop.Inject(ctx, api.HeaderCarrier(reply.Header))
	}
	_ = r.nc.PublishMsg(reply)
}

func (r *Replica) replyJSON(m *nats.Msg, v any) {
	if m.Reply == "" {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		r.replyError(m, nil, api.NewError(api.CodeInternal, err.Error(), err))
		return
	}
	_ = m.Respond(data)
}

func (r *Replica) lifecycleHandler(op string, admin bool) nats.MsgHandler {
	return func(m *nats.Msg) {
		// Lifecycle calls are quick (a scheduler call, or one forward):
		// run them off the subscription goroutine only when forwarding.
		ctx := context.Background()
		if len(m.Header) > 0 {
			ctx = r.prop.Extract(ctx, api.HeaderCarrier(m.Header))
		}
		var lr api.LifecycleRequest
		if err := api.DecodeLifecycleRequest(m.Data, &lr); err != nil {
			r.replyError(m, ctx, mapError(err))
			return
		}
		if lr.Replica != "" && lr.Replica != r.id {
			// Forwarding waits for another replica: off the callback,
			// admitted here so that Close waits for it, and bounded by
			// the forwarding pool.
			if e := r.enterForward(ctx, op); e != nil {
				r.replyError(m, ctx, e)
				return
			}
			go func() {
				defer r.leaveForward()
				r.answerLifecycle(ctx, m, op, &lr, lifecycleVia{pooled: true, admin: admin})
			}()
			return
		}
		r.answerLifecycle(ctx, m, op, &lr, lifecycleVia{admin: admin})
	}
}

func (r *Replica) answerLifecycle(ctx context.Context, m *nats.Msg, op string, lr *api.LifecycleRequest, via lifecycleVia) {
	resp, err := r.lifecycleCall(ctx, op, lr, via)
	if err != nil {
		r.replyError(m, ctx, mapError(err))
		return
	}
	if m.Reply == "" {
		return // fire-and-forget call
	}
	_ = m.Respond(api.AppendLifecycleResponse(nil, resp))
}

// enterForward admits one forwarded lifecycle call into the forwarding
// pool (Config.ForwardConcurrency calls at once, each bounded by
// ForwardTimeout), or refuses it with a 529 at once: a flood of calls for
// an unresponsive replica holds at most the pool, not a goroutine each.
// leaveForward ends an admitted one.
func (r *Replica) enterForward(ctx context.Context, op string) *api.Error {
	return r.admitTo(r.fwd, func() *api.Error {
		r.m.lifecycleDone(ctx, op, api.CodeOverloaded)
		return api.NewError(api.CodeOverloaded, "replica "+r.id+" is forwarding "+strconv.Itoa(r.cfg.ForwardConcurrency)+
			" lifecycle calls already (forward concurrency); retry, or send the call to the replica holding the booking", nil)
	})
}

func (r *Replica) leaveForward() { r.leaveFrom(r.fwd) }

// forwardLifecycle sends a lifecycle call to the replica that holds the
// booking and relays its answer, within ForwardTimeout. HTTP and
// in-process callers pass the forwarding pool here; NATS callers were
// admitted to it already (lifecycleHandler).
func (r *Replica) forwardLifecycle(ctx context.Context, op string, lr *api.LifecycleRequest, via lifecycleVia) (*api.LifecycleResponse, error) {
	if !via.pooled {
		if e := r.enterForward(ctx, op); e != nil {
			return nil, e
		}
		defer r.leaveForward()
	}
	body, _ := json.Marshal(lr)
	subject := api.ReplicaSubject(r.cfg.Prefix, lr.Replica, op)
	if via.admin {
		subject = api.AdminReplicaSubject(r.cfg.Prefix, lr.Replica, op)
	}
	m := nats.NewMsg(subject)
	m.Data = body
	r.prop.Inject(ctx, api.HeaderCarrier(m.Header))
	fctx, cancel := context.WithTimeout(ctx, r.cfg.ForwardTimeout)
	defer cancel()
	reply, err := r.nc.RequestMsgWithContext(fctx, m)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, api.NewError(api.CodeNotFound, "replica "+strconv.Quote(lr.Replica)+" holding request "+strconv.Quote(lr.RequestID)+
				" is gone; its booking expires on its own", err).OnField("replica")
		}
		return nil, fmt.Errorf("forward %s to replica %s: %w", op, lr.Replica, err)
	}
	if e := api.DecodeError(reply.Data); e != nil {
		return nil, e
	}
	var out api.LifecycleResponse
	if err := json.Unmarshal(reply.Data, &out); err != nil {
		return nil, fmt.Errorf("forward %s to replica %s: bad reply: %w", op, lr.Replica, err)
	}
	return &out, nil
}

func (r *Replica) onWorkersMsg(model string) nats.MsgHandler {
	return func(m *nats.Msg) {
		resp, err := r.Workers(model)
		if err != nil {
			r.replyError(m, nil, mapError(err))
			return
		}
		r.replyJSON(m, resp)
	}
}

func (r *Replica) onSessionMsg(model string, end bool) nats.MsgHandler {
	return func(m *nats.Msg) {
		var sr api.SessionRequest
		if err := api.DecodeJSON(m.Data, &sr); err != nil {
			r.replyError(m, nil, mapError(err))
			return
		}
		if sr.Model == "" {
			sr.Model = model
		}
		if sr.Model != model {
			r.replyError(m, nil, api.BadField("model", "%q does not match the subject's model %q", sr.Model, model))
			return
		}
		if e := r.enter(); e != nil {
			r.replyError(m, nil, e)
			return
		}
		go func() {
			defer r.leave()
			ctx, cancel := context.WithTimeout(context.Background(), sessionTimeout)
			defer cancel()
			if end {
				if err := r.EndSession(ctx, sr.Model, sr.SessionID); err != nil {
					r.replyError(m, nil, mapError(err))
					return
				}
				r.replyJSON(m, map[string]any{"v": api.APIVersion, "session_id": sr.SessionID, "ended": true})
				return
			}
			resp, err := r.Session(ctx, sr.Model, sr.SessionID)
			if err != nil {
				r.replyError(m, nil, mapError(err))
				return
			}
			r.replyJSON(m, resp)
		}()
	}
}
