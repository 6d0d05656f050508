package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Client calls the route API over NATS. It is what the demo, the bench
// harness and the tests use, and a reference for clients in other
// languages: every call is one NATS request with a JSON body (a route
// request's token ids, or block hashes, follow it in binary:
// AppendRouteBody); the reply is
// the answer or an error envelope. Safe for concurrent use.
type Client struct {
	// NoRouterWait is how long a request that finds no replica subscribed
	// is retried before it fails with ErrNoRouter (within its context's
	// deadline; zero = DefaultNoRouterWait, negative = fail at once).
	// While a NATS node fails over, a surviving server has not yet learnt
	// the replicas' subscriptions as they reconnect: "no responders" then
	// means "not yet", and a message no one received is safe to resend.
	NoRouterWait time.Duration

	nc     *nats.Conn
	prefix string
	prop   propagation.TextMapPropagator
	pool   sync.Pool // *[]byte request buffers
}

// DefaultNoRouterWait bounds the retries of a request that finds no
// replica: longer than a client's or a replica's reconnection to another
// server of the cluster.
const DefaultNoRouterWait = 2 * time.Second

// NewClient returns a client for the replicas behind prefix ("" = kvr).
// prop injects trace context into request headers; nil = W3C trace context.
func NewClient(nc *nats.Conn, prefix string, prop propagation.TextMapPropagator) *Client {
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	return &Client{nc: nc, prefix: PrefixOrDefault(prefix), prop: prop}
}

// ErrNoRouter means no replica answered: none is subscribed (or ready) for
// the model.
var ErrNoRouter = errors.New("no router replica answered")

func (c *Client) request(ctx context.Context, subject string, body []byte) ([]byte, error) {
	m := &nats.Msg{Subject: subject, Data: body}
	// Headers only when there is a context to carry: a header map per
	// request costs allocations the common case does not need.
	if trace.SpanContextFromContext(ctx).IsValid() || baggage.FromContext(ctx).Len() > 0 {
		m.Header = nats.Header{}
		c.prop.Inject(ctx, HeaderCarrier(m.Header))
	}
	reply, err := c.nc.RequestMsgWithContext(ctx, m)
	for wait := (noRouterBackoff{limit: c.NoRouterWait}); errors.Is(err, nats.ErrNoResponders) && wait.next(ctx); {
		reply, err = c.nc.RequestMsgWithContext(ctx, m)
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("%w on %s: %w", ErrNoRouter, subject, err)
		}
		return nil, fmt.Errorf("request %s: %w", subject, err)
	}
	if st := reply.Header.Get(HeaderStatus); st != "" && st != "200" {
		if e := DecodeError(reply.Data); e != nil {
			return nil, e
		}
		code, _ := strconv.Atoi(st)
		return nil, &Error{Code: CodeInternal, Status: code, Message: "reply status " + st + " without an error body"}
	}
	return reply.Data, nil
}

// Route asks for a worker. An API error is returned as an *Error (test it
// with errors.Is against ErrPinConflict, ErrOverloaded...).
func (c *Client) Route(ctx context.Context, req *RouteRequest) (*RouteResponse, error) {
	var resp RouteResponse
	if err := c.RouteInto(ctx, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// RouteInto is Route writing into a caller-owned response. A request
// too large for one NATS message is sent as block hashes when it gives a
// block size, else refused before sending (fitRoute, ErrPayloadTooLarge).
func (c *Client) RouteInto(ctx context.Context, req *RouteRequest, resp *RouteResponse) error {
	bp, _ := c.pool.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	body, err := fitRoute(AppendRouteBody((*bp)[:0], req), req, c.MaxRouteBody())
	var data []byte
	if err == nil {
		data, err = c.request(ctx, RouteSubject(c.prefix, req.Model), body)
	}
	*bp = body
	c.pool.Put(bp)
	if err != nil {
		return err
	}
	if err := DecodeRouteResponse(data, resp); err != nil {
		return fmt.Errorf("decode route reply: %w", err)
	}
	return nil
}

// PrefillDone reports that the request's prefill finished (its first token
// was produced): its prefill tokens leave the worker's predicted load.
func (c *Client) PrefillDone(ctx context.Context, model string, r *RouteResponse) error {
	return c.lifecycle(ctx, OpPrefillDone, model, r)
}

// Free reports that the request finished: its booking is released.
func (c *Client) Free(ctx context.Context, model string, r *RouteResponse) error {
	return c.lifecycle(ctx, OpFree, model, r)
}

// ServeWhole reports that the decode leg of split route r serves the whole
// request: its prefill leg failed before the decode leg started.
func (c *Client) ServeWhole(ctx context.Context, model string, r *RouteResponse) error {
	return c.lifecycle(ctx, OpServeWhole, model, r)
}

// Cancel withdraws a request: it leaves the queue if it is waiting, and its
// booking is released if it was routed. key is the request key requestID
// was made from (NewRequestID): the proof that the caller owns it.
func (c *Client) Cancel(ctx context.Context, model, requestID, key string) error {
	return c.lifecycle(ctx, OpCancel, model, &RouteResponse{RequestID: requestID, Fence: key})
}

// Admin makes lifecycle call op (OpPrefillDone, OpFree, OpCancel, OpServeWhole) on any
// client's request without its fence, on the operator's subjects
// (AdminSubject): only an operator's NATS user may publish there. replica
// is the replica holding the request ("" = any replica of the model).
func (c *Client) Admin(ctx context.Context, op, model, requestID, replica string) error {
	body, err := json.Marshal(&LifecycleRequest{V: APIVersion, RequestID: requestID, Model: model, Replica: replica})
	if err != nil {
		return err
	}
	subject := AdminSubject(c.prefix, op, model)
	if replica != "" {
		subject = AdminReplicaSubject(c.prefix, replica, op)
	}
	_, err = c.request(ctx, subject, body)
	return err
}

func (c *Client) lifecycle(ctx context.Context, op, model string, r *RouteResponse) error {
	body, err := json.Marshal(&LifecycleRequest{V: APIVersion, RequestID: r.RequestID, Model: model, Attempt: r.Attempt, Fence: r.Fence, Replica: r.Replica})
	if err != nil {
		return err
	}
	// Address the replica holding the booking directly when it is known;
	// any replica would forward it there.
	subject := LifecycleSubject(c.prefix, op, model)
	if r.Replica != "" {
		subject = ReplicaSubject(c.prefix, r.Replica, op)
	}
	_, err = c.request(ctx, subject, body)
	return err
}

// Workers lists a model's workers as one replica sees them.
func (c *Client) Workers(ctx context.Context, model string) (*WorkersResponse, error) {
	data, err := c.request(ctx, WorkersSubject(c.prefix, model), []byte(`{"v":1}`))
	if err != nil {
		return nil, err
	}
	var out WorkersResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("decode workers reply: %w", err)
	}
	return &out, nil
}

// Session reads a session's binding.
func (c *Client) Session(ctx context.Context, model, session string) (*SessionResponse, error) {
	body, _ := json.Marshal(&SessionRequest{V: APIVersion, Model: model, SessionID: session})
	data, err := c.request(ctx, SessionGetSubject(c.prefix, model), body)
	if err != nil {
		return nil, err
	}
	var out SessionResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("decode session reply: %w", err)
	}
	return &out, nil
}

// EndSession removes a session's binding.
func (c *Client) EndSession(ctx context.Context, model, session string) error {
	body, _ := json.Marshal(&SessionRequest{V: APIVersion, Model: model, SessionID: session})
	_, err := c.request(ctx, SessionEndSubject(c.prefix, model), body)
	return err
}

// noRouterBackoff paces the retries of a request that found no replica:
// 10 ms doubling to 200 ms, for at most limit in all.
type noRouterBackoff struct {
	limit, waited, step time.Duration
}

// next sleeps before the next try and reports whether to make it: not
// once the limit is spent or the context would end first.
func (b *noRouterBackoff) next(ctx context.Context) bool {
	limit := b.limit
	if limit == 0 {
		limit = DefaultNoRouterWait
	}
	b.step = min(max(2*b.step, 10*time.Millisecond), 200*time.Millisecond)
	if b.waited+b.step > limit {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < b.step {
		return false
	}
	t := time.NewTimer(b.step)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	b.waited += b.step
	return true
}
