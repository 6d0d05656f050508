package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workerref"
)

// Process is one HTTP request's ext_proc stream. Request side: the
// headers are kept, the body buffered to its end (end_of_stream, or the
// trailers), then the request is read, tokenized and routed as the gateway
// does, and the answers go out in the protocol's order: headers (the
// destination), body (streamed back unchanged), trailers. Response side:
// the served endpoint is checked against the pick, the first body chunk is
// prefill done, the end of the body frees the booking; whatever way the
// stream ends, the booking is freed (never leaked).
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	x := &stream{s: s, srv: srv, ctx: srv.Context()}
	defer x.free()
	for {
		req, err := srv.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || x.ctx.Err() != nil {
				return nil // the proxy ended the stream (or the client went away)
			}
			return err
		}
		done, err := x.handle(req)
		if err != nil || done {
			return err
		}
	}
}

// stream is one request's state in Process.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	path, method string
	header       http.Header
	subset       []string // the proxy's candidate subset, when hinted
	hinted       bool
	body         []byte
	bodySeen     bool // a request body message arrived
	picked       bool // the destination went out

	rq                *api.RouteRequest
	rs                api.RouteResponse
	dest              string // the pick's ip:port
	booked, prefilled bool
	respBody          bool // a response body chunk arrived
}

// handle takes one message from the proxy; done ends the stream (an
// immediate response went out, or the exchange is over).
func (x *stream) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		x.path, x.method, x.header = readHeaders(v.RequestHeaders.GetHeaders())
		x.subset, x.hinted = subsetHint(req.GetMetadataContext())
		if v.RequestHeaders.GetEndOfStream() {
			return x.requestDone(false, nil)
		}
	case *extprocv3.ProcessingRequest_RequestBody:
		x.body, x.bodySeen = append(x.body, v.RequestBody.GetBody()...), true
		if limit := x.s.g.MaxBodyBytes(); int64(len(x.body)) > limit {
			e := &gateway.RequestError{Status: http.StatusRequestEntityTooLarge, Code: "request_too_large",
				Message: "the request body is larger than " + strconv.FormatInt(limit, 10) + " bytes"}
			return true, x.refuse(e)
		}
		if v.RequestBody.GetEndOfStream() {
			return x.requestDone(true, nil)
		}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if x.picked { // not sent after a body's end_of_stream; answered all the same
			return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
		}
		return x.requestDone(x.bodySeen, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		x.checkServed(req.GetMetadataContext())
		if err := x.send(x.responseHeaders()); err != nil {
			return true, err
		}
		if v.ResponseHeaders.GetEndOfStream() {
			x.free()
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		x.checkServed(req.GetMetadataContext())
		eos := v.ResponseBody.GetEndOfStream()
		if !x.respBody && !eos && x.booked && !x.prefilled {
			// The first chunk of the reply is its first token (or the
			// whole of it, which the free right after covers).
			x.prefilled = true
			x.s.g.PrefillDone(x.ctx, x.rq.Model, &x.rs)
		}
		x.respBody = true
		if eos {
			x.free()
		}
		for _, r := range bodyResponses(v.ResponseBody.GetBody(), eos, false) {
			if err := x.send(r); err != nil {
				return true, err
			}
		}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.free()
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

// requestDone picks the destination once the request is complete and
// answers in order: headers, the body streamed back when the proxy sent
// one (end_of_stream on its last chunk unless trailers follow), then
// trailers (trailers non-nil).
func (x *stream) requestDone(hasBody bool, trailers *extprocv3.ProcessingResponse) (bool, error) {
	t0 := time.Now()
	dest, rerr := x.pick()
	if rerr != nil {
		return true, x.refuse(rerr)
	}
	set := []*corev3.HeaderValueOption{setHeader("content-length", strconv.Itoa(len(x.body)))}
	if x.booked {
		set = append(set, setHeader(strings.ToLower(gateway.RankHeader), strconv.FormatUint(uint64(x.rs.Rank), 10)))
	}
	if err := x.send(destinationResponse(dest, set...)); err != nil {
		return true, err
	}
	x.picked = true
	x.s.m.pick.Record(x.ctx, time.Since(t0).Seconds())
	if hasBody {
		for _, r := range bodyResponses(x.body, trailers == nil, true) {
			if err := x.send(r); err != nil {
				return true, err
			}
		}
	}
	x.body = nil
	if trailers != nil {
		return false, x.send(trailers)
	}
	return false, nil
}

// pick is the destination list of the request: a generate request is
// read, tokenized and routed as the gateway does (its booking is x's),
// restricted to the proxy's subset hint; any other request (no body, a path
// the gateway does not route) goes to a live worker in turn, unbooked.
func (x *stream) pick() (string, *gateway.RequestError) {
	if x.method != http.MethodPost || (x.path != gateway.PathChat && x.path != gateway.PathCompletion) {
		return x.passthrough()
	}
	ctx, span := x.s.g.StartSpan(x.ctx, "epp "+x.path, x.header)
	defer span.End()
	rq, key, rerr := x.s.g.Prepare(ctx, x.path, x.header, x.body)
	if rerr != nil {
		return "", rerr
	}
	live := x.s.g.Engines(ctx, rq.Model)
	if x.hinted {
		allowed := x.inSubset(live, rq.AllowedWorkers)
		if len(allowed) == 0 {
			return "", noEligible("no worker of the proxy's candidate subset %v can take the request", x.subset)
		}
		rq.AllowedWorkers = allowed
	}
	x.rq = rq
	if rerr := x.s.g.Route(ctx, rq, key, &x.rs); rerr != nil {
		return "", rerr
	}
	x.booked, x.prefilled = true, false
	x.dest = hostPort(x.rs.Endpoint)
	return strings.Join(append([]string{x.dest}, x.fallbacks(live)...), ","), nil
}

// inSubset are the live workers whose address is in the subset hint
// (and in allowed, when the request already has an allowed set: an
// adapter's workers).
func (x *stream) inSubset(live []gateway.Engine, allowed []string) []string {
	var out []string
	for _, e := range live {
		if slices.Contains(x.subset, hostPort(e.Root)) && (len(allowed) == 0 || slices.Contains(allowed, e.Worker)) {
			out = append(out, e.Worker)
		}
	}
	return out
}

// fallbacks are up to Config.Fallbacks other eligible endpoints, in turn
// from a rotating start so that retries spread: none for a Hard session
// (another worker would break its binding) or a rank other than 0 (the
// rank header goes with the request).
func (x *stream) fallbacks(live []gateway.Engine) []string {
	n := x.s.cfg.Fallbacks
	if n <= 0 || x.rs.Rank != 0 || (x.rs.Binding != nil && x.rs.Binding.Mode == "hard") || len(live) < 2 {
		return nil
	}
	var out []string
	start := int(x.s.next.Add(1) % uint64(len(live)))
	for i := range live {
		e := live[(start+i)%len(live)]
		addr := hostPort(e.Root)
		if e.Worker == x.rs.Worker || addr == x.dest || slices.Contains(out, addr) ||
			(len(x.rq.AllowedWorkers) > 0 && !slices.Contains(x.rq.AllowedWorkers, e.Worker)) {
			continue
		}
		if out = append(out, addr); len(out) == n {
			break
		}
	}
	return out
}

// passthrough sends a request the router does not route (GET /v1/models, a
// path the gateway does not serve) to a live worker of any configured
// model, in turn, within the subset hint; nothing is booked.
func (x *stream) passthrough() (string, *gateway.RequestError) {
	var addrs []string
	for _, m := range x.s.g.Models() {
		for _, e := range x.s.g.Engines(x.ctx, m) {
			if a := hostPort(e.Root); (!x.hinted || slices.Contains(x.subset, a)) && !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	if len(addrs) == 0 {
		return "", noEligible("no live worker for %s %s", x.method, x.path)
	}
	return addrs[int(x.s.next.Add(1)%uint64(len(addrs)))], nil
}

func noEligible(format string, args ...any) *gateway.RequestError {
	return &gateway.RequestError{Status: http.StatusServiceUnavailable, Code: api.CodeNoEligibleWorker,
		Message: "no worker can take the request: " + fmt.Sprintf(format, args...)}
}

// checkServed compares the endpoint the proxy reports as having served
// with the pick: a fallback served, so the pick's booking is freed at
// once (the fallback's load is not booked).
func (x *stream) checkServed(md *corev3.Metadata) {
	served := servedEndpoint(md)
	if served == "" || !x.booked || served == x.dest {
		return
	}
	x.s.m.elsewhere.Add(x.ctx, 1)
	x.s.log.Debug("served by a fallback: booking freed", "request", x.rs.RequestID, "pick", x.dest, "served", served)
	x.free()
}

// responseHeaders passes the reply's headers with what routing did, as
// the gateway's replies carry it.
func (x *stream) responseHeaders() *extprocv3.ProcessingResponse {
	hr := &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}
	if x.rq != nil {
		outcome := api.OutcomeNone
		if x.rs.Binding != nil {
			outcome = x.rs.Binding.Outcome
		}
		hr.Response.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			setHeader(strings.ToLower(gateway.HeaderWorker), workerref.Of(x.rs.Worker, x.rs.Rank).String()),
			setHeader(strings.ToLower(gateway.HeaderOverlapBlocks), strconv.Itoa(x.rs.OverlapBlocks)),
			setHeader(strings.ToLower(gateway.HeaderSessionOutcome), outcome),
		}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}}
}

// refuse answers the request locally (the proxy sends it to the client)
// and ends the stream.
func (x *stream) refuse(e *gateway.RequestError) error {
	x.s.m.refused.Add(x.ctx, 1, metric.WithAttributes(attribute.Int("status", e.Status)))
	return x.send(immediate(e))
}

func (x *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := x.srv.Send(r); err != nil {
		return status.Errorf(codes.Unavailable, "epp: sending to the proxy: %v", err)
	}
	return nil
}

// free releases the booking, once (the gateway's Free outlives a stream
// that ended).
func (x *stream) free() {
	if !x.booked {
		return
	}
	x.booked = false
	x.s.g.Free(x.ctx, x.rq.Model, &x.rs)
}
