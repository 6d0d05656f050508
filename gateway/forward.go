package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workerref"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// exchange is one routed request: its booking (freed exactly once), its
// upstream call and the relay of the reply.
type exchange struct {
	g    *Gateway
	w    http.ResponseWriter
	r    *http.Request
	kind string
	cr   *clientRequest
	body []byte
	rq   *api.RouteRequest
	key  string // the request key rq.RequestID was made from: a cancel's proof of ownership
	t0   time.Time
	span trace.Span

	rs        api.RouteResponse
	routing   time.Duration // in route calls, over every attempt (Server-Timing)
	booked    bool          // rs holds a booking not yet freed
	prefilled bool

	// the prefill leg of a split route (pd.go): its booking, whether it is
	// still held, and (SGLang) closed when its leg has ended
	pre       *api.RouteResponse
	preBooked bool
	preDone   chan struct{}
}

// upstreamFailure is an attempt that failed before the first byte reached
// the client: it may be retried on another worker.
type upstreamFailure struct {
	phase  string
	worker string
	err    error
}

func (f *upstreamFailure) Error() string {
	return fmt.Sprintf("upstream %s (%s): %v", f.worker, f.phase, f.err)
}

// run routes and forwards, retrying once on another worker (excluded from
// the first through the allowed set) when the first attempt fails before
// its first byte, then relays the reply.
func (x *exchange) run(ctx context.Context) {
	defer x.free(ctx)
	up, err := x.attempt(ctx)
	var uf *upstreamFailure
	if errors.As(err, &uf) {
		x.g.m.upstreamError(ctx, uf.phase)
		x.free(ctx)
		if allowed := x.g.retryAllowed(ctx, x.rq, uf.worker); len(allowed) > 0 && ctx.Err() == nil {
			x.g.m.retries.Add(ctx, 1)
			x.span.AddEvent("retry", trace.WithAttributes(attribute.String("kvr.failed_worker", uf.worker)))
			x.rq.RequestID, x.key = x.g.newRequestID()
			x.rq.AllowedWorkers = allowed
			first := uf
			up, err = x.attempt(ctx)
			var re *RequestError
			switch {
			case errors.As(err, &uf):
				x.g.m.upstreamError(ctx, uf.phase)
			case errors.As(err, &re) && ctx.Err() == nil:
				// The router refused the retry (a Hard session bound to
				// the failed worker, no other eligible worker): the
				// client's problem is still the failed engine.
				err = serverError(http.StatusBadGateway, "upstream_error", "%v; the retry on another worker was refused: %s", first, re.Message)
			}
		}
	}
	if err != nil {
		var re *RequestError
		if !errors.As(err, &re) {
			re = serverError(http.StatusBadGateway, "upstream_error", "the engine could not be reached: %v", err)
		}
		x.g.fail(ctx, x.span, x.w, re)
		return
	}
	defer up.Body.Close()
	x.setHeaders(up)
	if x.cr.Stream && up.StatusCode == http.StatusOK {
		x.stream(ctx, up)
		return
	}
	x.whole(ctx, up)
}

// attempt routes the request and sends it to the chosen worker. A failure
// to connect, or a 5xx answer, is an *upstreamFailure; a route failure a
// *RequestError.
func (x *exchange) attempt(ctx context.Context) (*http.Response, error) {
	if err := x.route(ctx); err != nil {
		return nil, err
	}
	body, err := x.decodeBody(ctx)
	if err != nil {
		return nil, err
	}
	ctx, span := x.g.tracer.Start(ctx, "upstream", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kvr.worker", x.rs.Worker)))
	defer span.End() // the span covers the call up to the reply's headers
	engineCallAttrs(span, x.kind, x.cr.Model, x.rs.Endpoint)
	url := engineRoot(x.rs.Endpoint) + x.r.URL.Path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, &upstreamFailure{phase: phaseConnect, worker: x.rs.Worker, err: err}
	}
	copyRequestHeaders(req.Header, x.r.Header)
	if x.g.cfg.APIKey != "" {
		req.Header.Del("Authorization") // the gateway's own key, not the engine's
	}
	req.Header.Set(RankHeader, strconv.FormatUint(uint64(x.rs.Rank), 10))
	x.g.tel.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	up, err := x.g.http.Do(req)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil, &upstreamFailure{phase: phaseConnect, worker: x.rs.Worker, err: err}
	}
	span.SetAttributes(attribute.Int("http.response.status_code", up.StatusCode))
	if up.StatusCode >= 500 {
		msg, _ := io.ReadAll(io.LimitReader(up.Body, 4096))
		up.Body.Close()
		span.SetStatus(codes.Error, up.Status)
		return nil, &upstreamFailure{phase: phaseStatus, worker: x.rs.Worker, err: fmt.Errorf("status %d: %s", up.StatusCode, bytes.TrimSpace(msg))}
	}
	return up, nil
}

// route asks the router for a worker (Gateway.Route) and holds the
// booking it gives.
func (x *exchange) route(ctx context.Context) error {
	took, re := x.g.route(ctx, x.rq, x.key, &x.rs)
	x.routing += took
	if re != nil {
		return re
	}
	x.booked, x.prefilled = true, false
	x.pre, x.preDone = x.rs.PrefillBooking(), nil
	x.preBooked = x.pre != nil
	return nil
}

// Route asks the router for a worker for rq, in a child span, and fills
// rs: on success rs holds a booking the caller must free (Free). A caller
// that goes away while its request waits in the router's queue cancels
// it with key, the request key its id was made from (Prepare). The failure is the client's answer (routeError). The route, and
// ctx's span, get the choice's attributes.
func (g *Gateway) Route(ctx context.Context, rq *api.RouteRequest, key string, rs *api.RouteResponse) *RequestError {
	_, re := g.route(ctx, rq, key, rs)
	return re
}

// route is Route, also returning how long the router took
// (kvr_gateway_route_seconds, and the exchange's Server-Timing).
func (g *Gateway) route(ctx context.Context, rq *api.RouteRequest, key string, rs *api.RouteResponse) (time.Duration, *RequestError) {
	parent := trace.SpanFromContext(ctx)
	ctx, span := g.tracer.Start(ctx, "route")
	defer span.End()
	t0 := time.Now()
	err := g.router.Route(ctx, rq, rs)
	took := time.Since(t0)
	g.m.route.Record(ctx, took.Seconds())
	if err != nil {
		if ctx.Err() != nil {
			cctx, cancel := g.callContext(ctx)
			if cerr := g.router.Cancel(cctx, rq.Model, rq.RequestID, key); cerr != nil && !errors.Is(cerr, api.ErrNotFound) {
				g.log.Debug("cancel", "request", rq.RequestID, "err", cerr)
			}
			cancel()
		}
		span.SetStatus(codes.Error, err.Error())
		return took, routeError(ctx, err)
	}
	outcome := api.OutcomeNone
	if rs.Binding != nil {
		outcome = rs.Binding.Outcome
	}
	attrs := []attribute.KeyValue{attribute.String("kvr.worker", workerref.Of(rs.Worker, rs.Rank).String()),
		attribute.Int("kvr.overlap_blocks", rs.OverlapBlocks), attribute.String("kvr.session_outcome", outcome),
		attribute.String("kvr.request_id", rs.RequestID)}
	span.SetAttributes(attrs...)
	parent.SetAttributes(attrs...)
	return took, nil
}

// callContext bounds a tokenize or lifecycle call; a lifecycle call must
// happen even when the client is gone, so it does not inherit ctx's end.
func (g *Gateway) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), g.cfg.CallTimeout)
}

// prefillDone reports the first token, once per booking.
func (x *exchange) prefillDone(ctx context.Context) {
	if !x.booked || x.prefilled {
		return
	}
	x.prefilled = true
	x.g.PrefillDone(ctx, x.rq.Model, &x.rs)
}

// free releases the booking, exactly once: at the end of the reply, on an
// upstream failure, or when the client went away.
func (x *exchange) free(ctx context.Context) {
	if x.preDone != nil {
		// An SGLang prefill leg has ended when its decode leg has (the
		// decode waited for its room); a prefill engine that never answers
		// is not waited on past CallTimeout (its leg ends with the
		// request's context).
		t := time.NewTimer(x.g.cfg.CallTimeout)
		select {
		case <-x.preDone:
		case <-t.C:
		}
		t.Stop()
		x.preDone = nil
	}
	x.freePrefill(ctx)
	if !x.booked {
		return
	}
	x.booked = false
	x.g.Free(ctx, x.rq.Model, &x.rs)
}

// PrefillDone reports the first token of the booking rs (of Route) to the
// router, within Config.CallTimeout even when ctx has ended. A failure is
// logged: the booking stays, and Free still releases it.
func (g *Gateway) PrefillDone(ctx context.Context, model string, rs *api.RouteResponse) {
	cctx, cancel := g.callContext(ctx)
	defer cancel()
	if err := g.router.PrefillDone(cctx, model, rs); err != nil {
		g.log.Debug("prefill_done", "request", rs.RequestID, "err", err)
	}
}

// Free releases the booking rs (of Route), within Config.CallTimeout even
// when ctx has ended (a client gone away must not leak it). Call it once
// per booking.
func (g *Gateway) Free(ctx context.Context, model string, rs *api.RouteResponse) {
	cctx, cancel := g.callContext(ctx)
	defer cancel()
	if err := g.router.Free(cctx, model, rs); err != nil {
		g.log.Warn("free", "request", rs.RequestID, "worker", rs.Worker, "err", err)
	}
}

// copyRequestHeaders passes the client's headers the engine may read
// (authorization for engines started with an API key, content
// negotiation), not hop-by-hop ones.
func copyRequestHeaders(dst, src http.Header) {
	for _, k := range []string{"Authorization", "Content-Type", "Accept", "User-Agent", "Baggage"} {
		if v := src.Values(k); len(v) > 0 {
			dst[k] = v
		}
	}
	if dst.Get("Content-Type") == "" {
		dst.Set("Content-Type", "application/json")
	}
}

// setHeaders writes the reply's headers: the engine's content headers and
// what routing did.
func (x *exchange) setHeaders(up *http.Response) {
	h := x.w.Header()
	for _, k := range []string{"Content-Type", "Cache-Control"} {
		if v := up.Header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	h.Set(HeaderWorker, workerref.Of(x.rs.Worker, x.rs.Rank).String())
	h.Set(HeaderOverlapBlocks, strconv.Itoa(x.rs.OverlapBlocks))
	outcome := api.OutcomeNone
	if x.rs.Binding != nil {
		outcome = x.rs.Binding.Outcome
	}
	h.Set(HeaderSessionOutcome, outcome)
	h.Set(HeaderServerTiming, ServerTiming(x.routing, time.Duration(x.rs.QueueWaitUS)*time.Microsecond))
	if p := x.rs.Prefill; p != nil {
		h.Set(HeaderPrefillWorker, workerref.Of(p.Worker, p.Rank).String())
	}
}

// whole relays a reply that is not streamed (or an engine's refusal): the
// whole body, flushed, then free (run's deferred call).
func (x *exchange) whole(ctx context.Context, up *http.Response) {
	data, err := readAll(up.Body, up.ContentLength)
	if err != nil {
		x.g.m.upstreamError(ctx, phaseStream)
		x.w.Header().Del("Content-Type")
		x.g.fail(ctx, x.span, x.w, serverError(http.StatusBadGateway, "upstream_error", "the engine's reply broke off: %v", err))
		return
	}
	x.g.setWriteDeadline(x.w)
	// With its length, the reply can be flushed whole now: the client
	// has it before the free that follows (a round trip to the router
	// over NATS), not when the handler returns.
	x.w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	x.w.WriteHeader(up.StatusCode)
	_, _ = x.w.Write(data)
	_ = http.NewResponseController(x.w).Flush()
	x.g.m.ttft.Record(ctx, time.Since(x.t0).Seconds())
	x.g.m.answered(ctx, up.StatusCode)
	x.span.SetAttributes(attribute.Int("http.response.status_code", up.StatusCode))
	// No prefill_done before the free that follows at once: free releases
	// the prefill and decode load together, so the call would change
	// nothing and cost a round trip to the router per request.
}

// readers pools the stream readers (one per stream, reused).
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 32<<10) }}

var (
	dataDone     = []byte("data: [DONE]")
	roleOnly     = []byte(`"delta":{"role":"assistant","content":""}`)
	emptyChoices = []byte(`"choices":[]`)
	dataPrefix   = []byte("data:")
)

// stream relays Server-Sent Events as they arrive. An event is flushed at
// its blank line unless the whole next event has already been read from
// the engine (flushLater): the events the engine wrote while the relay was
// busy go out in one write instead of one each (a system call per event
// on each side is where the relay's CPU goes: BenchmarkStreamRelay,
// docs/benchmarks/gateway.md), and no event waits for the network. The
// first token is flushed at once. The first event carrying tokens is the
// first token: prefill_done. After the first byte an upstream failure ends
// the stream with an error event; a client that goes away ends it (the
// engine's request is cancelled with the upstream context).
func (x *exchange) stream(ctx context.Context, up *http.Response) {
	rc := http.NewResponseController(x.w)
	// Each write gets WriteTimeout: the deadline moves on as events go out
	// (at most once a second, to spare the timer), so a client that stops
	// reading is dropped while a long stream is not.
	moved := time.Now()
	_ = rc.SetWriteDeadline(moved.Add(x.g.cfg.WriteTimeout))
	x.w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	br := readers.Get().(*bufio.Reader)
	br.Reset(up.Body)
	defer func() { br.Reset(nil); readers.Put(br) }()

	var (
		done, tokens bool // [DONE] seen; this event carries tokens
		pending      bool // bytes written and not flushed
		last         time.Time
		status       = http.StatusOK
	)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if bytes.HasPrefix(line, dataPrefix) {
				done = done || bytes.HasPrefix(line, dataDone)
				tokens = !done && !bytes.Contains(line, roleOnly) && !bytes.Contains(line, emptyChoices)
			}
			if _, werr := x.w.Write(line); werr != nil {
				status = api.StatusCanceled // the client went away
				break
			}
			pending = true
			if isBlank(line) {
				now := time.Now()
				first := tokens && !x.prefilled
				if first || !flushLater(br) {
					if now.Sub(moved) >= time.Second {
						moved = now
						_ = rc.SetWriteDeadline(now.Add(x.g.cfg.WriteTimeout))
					}
					if ferr := rc.Flush(); ferr != nil {
						status = api.StatusCanceled
						break
					}
					pending = false
				}
				if tokens {
					if first {
						x.g.m.ttft.Record(ctx, now.Sub(x.t0).Seconds())
						x.prefillDone(ctx)
					} else {
						x.g.m.itl.Record(ctx, now.Sub(last).Seconds())
					}
					last, tokens = now, false
				}
			}
		}
		if err == nil || errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if pending {
			_ = rc.Flush() // what the engine sent before its body ended or broke
		}
		if done && errors.Is(err, io.EOF) {
			break
		}
		if x.r.Context().Err() != nil {
			status = api.StatusCanceled
			break
		}
		// The engine's body ended before [DONE], or broke.
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		x.g.m.upstreamError(ctx, phaseStream)
		x.span.SetStatus(codes.Error, err.Error())
		status = http.StatusBadGateway
		x.errorEvent(rc, err)
		break
	}
	x.g.m.answered(ctx, status)
	x.span.SetAttributes(attribute.Int("http.response.status_code", status))
}

// flushLater reports whether the flush at the end of an event can wait for
// the next one: br already holds the whole next event (up to its blank
// line), so relaying it needs no read from the network. Reading more than
// that would make a client wait for the engine.
func flushLater(br *bufio.Reader) bool {
	n := br.Buffered()
	if n == 0 {
		return false
	}
	next, _ := br.Peek(n)
	return bytes.Contains(next, blankLF) || bytes.Contains(next, blankCRLF)
}

var (
	blankLF   = []byte("\n\n")
	blankCRLF = []byte("\n\r\n")
)

// errorEvent ends a broken stream: an error event in OpenAI's shape (the
// SDKs turn it into a stream error), then [DONE].
func (x *exchange) errorEvent(rc *http.ResponseController, cause error) {
	e := serverError(http.StatusBadGateway, "upstream_error", "the engine's stream broke off (worker %s): %v", x.rs.Worker, cause)
	var b bytes.Buffer
	b.WriteString("data: ")
	_ = writeJSONTo(&b, e.body())
	b.WriteString("\n\ndata: [DONE]\n\n")
	_, _ = x.w.Write(b.Bytes())
	_ = rc.Flush()
}

func isBlank(line []byte) bool {
	return len(line) == 1 && line[0] == '\n' || len(line) == 2 && line[0] == '\r' && line[1] == '\n'
}
