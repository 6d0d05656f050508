package gateway

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/kvrouter/kvrouter/router/api"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// This file is what the endpoint picker (package epp) uses of the gateway
// besides Route, PrefillDone and Free (forward.go): the same request
// reading and tokenization as generate, its server span, the worker list,
// and the error shape. The picker answers Envoy instead of relaying a reply, so it needs
// nothing else.

// Generate paths, as the gateway serves them and the picker reads them
// from Envoy's :path.
const (
	PathChat       = "/v1/chat/completions"
	PathCompletion = "/v1/completions"
)

// Prepare builds the route request of a generate request, exactly as the
// gateway's own POST handler does: path is PathChat or PathCompletion
// (another is 404), h the client's headers (the session id and mode), body
// the whole client body. The request id is fresh; the prompt is tokenized
// by a live engine (or cut into pseudo-blocks with TokenizerApprox). key is
// the request key the id was made from: pass it to Route, which cancels a
// queued request with it. The failure is the client's answer.
func (g *Gateway) Prepare(ctx context.Context, path string, h http.Header, body []byte) (rq *api.RouteRequest, key string, rerr *RequestError) {
	var kind string
	switch path {
	case PathChat:
		kind = kindChat
	case PathCompletion:
		kind = kindCompletion
	default:
		return nil, "", notFound("unknown_url", "%s is not a generate path (the endpoint picker routes %s and %s)", path, PathChat, PathCompletion)
	}
	rq, _, key, rerr = g.routeRequest(ctx, kind, h, body)
	return rq, key, rerr
}

// StartSpan starts the server span of one client request under the trace
// context its headers h carry (the gateway's propagator and tracer): the
// parent of the tokenize and route spans.
func (g *Gateway) StartSpan(ctx context.Context, name string, h http.Header) (context.Context, trace.Span) {
	ctx = g.tel.Propagator.Extract(ctx, propagation.HeaderCarrier(h))
	return g.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
}

// Engine is one ready worker of a model: its id and its registered
// endpoint's server root ("http://host:port").
type Engine struct {
	Worker string
	Root   string
}

// Engines lists the ready workers of a configured model (one entry per
// worker, whatever its ranks), from the cache the gateway keeps for at most
// Config.WorkersTTL.
func (g *Gateway) Engines(ctx context.Context, model string) []Engine {
	es := g.liveWorkers(ctx, model)
	out := make([]Engine, len(es))
	for i, e := range es {
		out[i] = Engine{Worker: e.worker, Root: e.root}
	}
	return out
}

// Models are the configured models, in order.
func (g *Gateway) Models() []string { return append([]string(nil), g.cfg.Models...) }

// MaxBodyBytes is the largest client body the gateway reads
// (Config.MaxBodyBytes).
func (g *Gateway) MaxBodyBytes() int64 { return g.cfg.MaxBodyBytes }

// SessionHeader is the header carrying the session id
// (Config.SessionHeader).
func (g *Gateway) SessionHeader() string { return g.cfg.SessionHeader }

// JSON is the error in OpenAI's shape, as the gateway answers it.
func (e *RequestError) JSON() []byte {
	data, err := json.Marshal(e.body())
	if err != nil { // not reached: the body holds strings only
		return []byte(`{"error":{"message":"encoding the error failed","type":"server_error","param":null,"code":"internal"}}`)
	}
	return data
}

// RetryAfter is the Retry-After the gateway sends with e, in seconds (0 =
// none): on a 429 and on a 503 bindings_unavailable.
func (e *RequestError) RetryAfter() int {
	if e.Status == http.StatusTooManyRequests || e.Code == api.CodeBindingsUnavailable {
		return retryAfterSeconds
	}
	return 0
}
