package gateway

import (
	"context"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
)

// Router is what the gateway needs of the router replicas: the route call,
// the three lifecycle calls, and the worker list (for /v1/models and for
// choosing the engine that tokenizes). Both an in-process replica
// (ReplicaRouter) and the route API over NATS (*api.Client, through
// ClientRouter) satisfy it.
type Router interface {
	// Route fills resp with the worker chosen for req.
	Route(ctx context.Context, req *api.RouteRequest, resp *api.RouteResponse) error
	// PrefillDone reports the request's first token.
	PrefillDone(ctx context.Context, model string, r *api.RouteResponse) error
	// Free releases the request's booking.
	Free(ctx context.Context, model string, r *api.RouteResponse) error
	// ServeWhole reports that the decode leg of a split route serves the
	// whole request (its prefill leg failed before it started).
	ServeWhole(ctx context.Context, model string, r *api.RouteResponse) error
	// Cancel withdraws a request that may still be queued; key is the
	// request key its id was made from (api.NewRequestID).
	Cancel(ctx context.Context, model, requestID, key string) error
	// Workers lists the workers of one model.
	Workers(ctx context.Context, model string) (*api.WorkersResponse, error)
}

// ClientRouter is the route API over NATS as a Router: what
// `kvrouter gateway` runs on.
type ClientRouter struct{ C *api.Client }

// Route asks a replica of the queue group.
func (c ClientRouter) Route(ctx context.Context, req *api.RouteRequest, resp *api.RouteResponse) error {
	return c.C.RouteInto(ctx, req, resp)
}

// PrefillDone is sent to the replica holding the booking.
func (c ClientRouter) PrefillDone(ctx context.Context, model string, r *api.RouteResponse) error {
	return c.C.PrefillDone(ctx, model, r)
}

// Free is sent to the replica holding the booking.
func (c ClientRouter) Free(ctx context.Context, model string, r *api.RouteResponse) error {
	return c.C.Free(ctx, model, r)
}

// ServeWhole is sent to the replica holding the booking.
func (c ClientRouter) ServeWhole(ctx context.Context, model string, r *api.RouteResponse) error {
	return c.C.ServeWhole(ctx, model, r)
}

// Cancel is sent to any replica of the model (the owner is not known yet).
func (c ClientRouter) Cancel(ctx context.Context, model, requestID, key string) error {
	return c.C.Cancel(ctx, model, requestID, key)
}

// Workers asks one replica.
func (c ClientRouter) Workers(ctx context.Context, model string) (*api.WorkersResponse, error) {
	return c.C.Workers(ctx, model)
}

// ReplicaRouter is an in-process replica as a Router: what
// `kvrouter serve --openai-addr` runs on, with no NATS hop for the route
// call (a lifecycle call for a booking held by another replica is still
// forwarded by the replica).
type ReplicaRouter struct{ R *host.Replica }

// Route calls the replica directly.
func (p ReplicaRouter) Route(ctx context.Context, req *api.RouteRequest, resp *api.RouteResponse) error {
	return p.R.Route(ctx, req, resp)
}

// PrefillDone calls the replica directly.
func (p ReplicaRouter) PrefillDone(ctx context.Context, model string, r *api.RouteResponse) error {
	return p.lifecycle(ctx, api.OpPrefillDone, model, r)
}

// Free calls the replica directly.
func (p ReplicaRouter) Free(ctx context.Context, model string, r *api.RouteResponse) error {
	return p.lifecycle(ctx, api.OpFree, model, r)
}

// ServeWhole calls the replica directly.
func (p ReplicaRouter) ServeWhole(ctx context.Context, model string, r *api.RouteResponse) error {
	return p.lifecycle(ctx, api.OpServeWhole, model, r)
}

// Cancel calls the replica directly.
func (p ReplicaRouter) Cancel(ctx context.Context, model, requestID, key string) error {
	return p.lifecycle(ctx, api.OpCancel, model, &api.RouteResponse{RequestID: requestID, Fence: key})
}

// Workers reads the replica's membership view.
func (p ReplicaRouter) Workers(_ context.Context, model string) (*api.WorkersResponse, error) {
	return p.R.Workers(model)
}

// lifecycle makes one lifecycle call on the booking of route reply r (its
// fence included).
func (p ReplicaRouter) lifecycle(ctx context.Context, op, model string, r *api.RouteResponse) error {
	_, err := p.R.Lifecycle(ctx, op, &api.LifecycleRequest{V: api.APIVersion, RequestID: r.RequestID, Model: model,
		Attempt: r.Attempt, Fence: r.Fence, Replica: r.Replica})
	return err
}
