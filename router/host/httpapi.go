package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// newHTTPHandler builds the HTTP API. Every endpoint speaks JSON; errors
// are the envelope of errors.go with the status of their code.
func (r *Replica) newHTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/route", r.httpRoute)
	mux.HandleFunc("POST /v1/requests/{id}/prefill_done", r.httpLifecycle(api.OpPrefillDone))
	mux.HandleFunc("POST /v1/requests/{id}/serve_whole", r.httpLifecycle(api.OpServeWhole))
	mux.HandleFunc("POST /v1/requests/{id}/cancel", r.httpLifecycle(api.OpCancel))
	mux.HandleFunc("DELETE /v1/requests/{id}", r.httpLifecycle(api.OpFree))
	mux.HandleFunc("GET /v1/workers", r.httpWorkers)
	mux.HandleFunc("GET /v1/sessions/{id}", r.httpSession)
	mux.HandleFunc("DELETE /v1/sessions/{id}", r.httpEndSession)
	mux.HandleFunc("GET /healthz", r.httpHealth)
	mux.HandleFunc("GET /readyz", r.httpReady)
	mux.HandleFunc("GET /metrics", r.httpMetrics)
	// Other methods on a known path: 405 with the envelope and Allow.
	for path, allow := range map[string]string{
		"/v1/route": "POST", "/v1/requests/{id}/prefill_done": "POST", "/v1/requests/{id}/cancel": "POST",
		"/v1/requests/{id}": "DELETE", "/v1/workers": "GET", "/v1/sessions/{id}": "GET, DELETE",
		"/healthz": "GET", "/readyz": "GET", "/metrics": "GET",
	} {
		mux.HandleFunc(path, func(w http.ResponseWriter, q *http.Request) {
			w.Header().Set("Allow", allow)
			r.writeError(w, q, &api.Error{Code: api.CodeMethodNotAllowed, Status: http.StatusMethodNotAllowed,
				Message: q.Method + " " + q.URL.Path + " is not supported (allowed: " + allow + ")"})
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, q *http.Request) {
		r.writeError(w, q, &api.Error{Code: api.CodeNotFound, Status: 404, Message: "no endpoint " + q.Method + " " + q.URL.Path})
	})
	return r.withToken(mux)
}

// withToken guards h with Config.HTTPToken: every call but the health
// endpoints (and /metrics when Config.MetricsOpen) must send
// "Authorization: Bearer <token>". The two values are compared as SHA-256
// sums in constant time, so neither the token nor its length leaks through
// timing.
func (r *Replica) withToken(h http.Handler) http.Handler {
	if r.cfg.HTTPToken == "" {
		return h
	}
	want := sha256.Sum256([]byte("Bearer " + r.cfg.HTTPToken))
	return http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		switch p := q.URL.Path; {
		case p == "/healthz", p == "/readyz", p == "/metrics" && r.cfg.MetricsOpen:
			h.ServeHTTP(w, q)
			return
		}
		got := sha256.Sum256(unsafeBytes(q.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvrouter"`)
			r.writeError(w, q, api.NewError(api.CodeUnauthorized, "this replica needs \"Authorization: Bearer <token>\" (serve --http-token)", nil))
			return
		}
		h.ServeHTTP(w, q)
	})
}

// bodyPool holds the buffers route bodies are read into. A buffer that grew
// past maxPooledBody is dropped rather than pooled, so a burst of large
// bodies leaves nothing behind once answered.
var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledBody = 256 << 10

func putBody(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBody {
		bodyPool.Put(buf)
	}
}

// setWriteDeadline bounds the writing of a reply from now on: a client
// that stops reading is dropped, while a request that waited in the
// scheduler queue before its reply is not cut.
func (r *Replica) setWriteDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(r.cfg.HTTPWriteTimeout))
}

// writeError answers with an error envelope. Every error an HTTP client
// gets passes here, so bad requests are counted here.
func (r *Replica) writeError(w http.ResponseWriter, q *http.Request, e *api.Error) {
	r.countBad(q.Context(), e)
	r.setWriteDeadline(w)
	w.Header().Set("Content-Type", "application/json")
	if ra := e.RetryAfterSeconds(); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(api.AppendError(nil, e))
}

func (r *Replica) writeJSON(w http.ResponseWriter, status int, v any) {
	r.setWriteDeadline(w)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// httpCtx extracts the caller's trace context from the request headers.
func (r *Replica) httpCtx(q *http.Request) context.Context {
	return r.prop.Extract(q.Context(), propagation.HeaderCarrier(q.Header))
}

func (r *Replica) httpRoute(w http.ResponseWriter, q *http.Request) {
	ctx := r.httpCtx(q)
	if e := r.admitRoute(); e != nil {
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		r.writeError(w, q, e)
		return
	}
	defer r.leaveRoute()
	buf := bodyPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer putBody(buf)
	s := r.getScratch()
	defer r.putScratch(s)
	err := readBody(buf, w, q, r.routeBodyLimit())
	if err == nil {
		err = api.DecodeRouteRequest(buf.Bytes(), &s.req)
	}
	if err != nil {
		e := mapError(err)
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		r.writeError(w, q, e)
		return
	}
	spanCtx, err := r.routeTraced(ctx, &s.req, &s.resp, s)
	if sc := trace.SpanContextFromContext(spanCtx); sc.IsValid() {
		r.prop.Inject(spanCtx, propagation.HeaderCarrier(w.Header()))
	}
	if err != nil {
		r.writeError(w, q, mapError(err))
		return
	}
	s.out = api.AppendRouteResponse(s.out[:0], &s.resp)
	r.setWriteDeadline(w)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(s.out)))
	if _, err := w.Write(s.out); err != nil {
		r.rollbackReply(&s.resp) // the client is gone and will not use the booking
	}
}

// readBody reads q's body into buf, at most limit bytes; a longer or
// unreadable body is a bad_request on field body. A body announced longer
// than limit is refused unread; one of known length is read into a buffer
// of its size (growing by doubling would hold up to twice as much). Once
// the body is read, the connection's read deadline (the server's
// ReadTimeout) is lifted: it bounds the reading of a request, and would
// otherwise cancel a request still waiting in the scheduler queue.
func readBody(buf *bytes.Buffer, w http.ResponseWriter, q *http.Request, limit int64) error {
	if q.ContentLength > limit {
		return api.BadField("body", "is %d bytes, the limit is %d", q.ContentLength, limit)
	}
	if q.ContentLength > 0 {
		buf.Grow(int(q.ContentLength) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, q.Body, limit))
	var mb *http.MaxBytesError
	switch {
	case err == nil:
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		return nil
	case errors.As(err, &mb):
		return api.BadField("body", "is larger than %d bytes", limit)
	}
	return api.BadField("body", "unreadable: %v", err)
}

// httpLifecycle serves POST /v1/requests/{id}/prefill_done,
// POST /v1/requests/{id}/cancel and DELETE /v1/requests/{id} (free). The
// optional JSON body or the query (?model=&attempt=&replica=&fence=) name
// the model, attempt, owning replica and the booking's fence.
func (r *Replica) httpLifecycle(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, q *http.Request) {
		ctx := r.httpCtx(q)
		var lr api.LifecycleRequest
		body := bodyPool.Get().(*bytes.Buffer)
		body.Reset()
		defer putBody(body)
		err := readBody(body, w, q, api.MaxLifecycleBodySize)
		if err == nil {
			err = api.DecodeLifecycleRequest(body.Bytes(), &lr)
		}
		if err != nil {
			r.writeError(w, q, mapError(err))
			return
		}
		id := q.PathValue("id")
		if lr.RequestID != "" && lr.RequestID != id {
			r.writeError(w, q, api.BadField("request_id", "%q in the body differs from %q in the path", lr.RequestID, id))
			return
		}
		lr.RequestID = id
		qv := q.URL.Query()
		if v := qv.Get("model"); v != "" {
			lr.Model = v
		}
		if v := qv.Get("replica"); v != "" {
			lr.Replica = v
		}
		if v := qv.Get("fence"); v != "" {
			lr.Fence = v
		}
		if v := qv.Get("attempt"); v != "" {
			a, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				r.writeError(w, q, api.BadField("attempt", "%q is not a non-negative integer", v))
				return
			}
			lr.Attempt = a
		}
		if op == api.OpFree && qv.Get("reason") == "cancel" {
			op = api.OpCancel
		}
		resp, err := r.Lifecycle(ctx, op, &lr)
		if err != nil {
			r.writeError(w, q, mapError(err))
			return
		}
		r.writeJSON(w, http.StatusOK, resp)
	}
}

func (r *Replica) httpWorkers(w http.ResponseWriter, q *http.Request) {
	resp, err := r.Workers(q.URL.Query().Get("model"))
	if err != nil {
		r.writeError(w, q, mapError(err))
		return
	}
	r.writeJSON(w, http.StatusOK, resp)
}

func (r *Replica) httpSession(w http.ResponseWriter, q *http.Request) {
	resp, err := r.Session(r.httpCtx(q), q.URL.Query().Get("model"), q.PathValue("id"))
	if err != nil {
		r.writeError(w, q, mapError(err))
		return
	}
	r.writeJSON(w, http.StatusOK, resp)
}

func (r *Replica) httpEndSession(w http.ResponseWriter, q *http.Request) {
	id := q.PathValue("id")
	if err := r.EndSession(r.httpCtx(q), q.URL.Query().Get("model"), id); err != nil {
		r.writeError(w, q, mapError(err))
		return
	}
	r.writeJSON(w, http.StatusOK, map[string]any{"v": api.APIVersion, "session_id": id, "ended": true})
}

// httpHealth answers 200 while the process runs (liveness).
func (r *Replica) httpHealth(w http.ResponseWriter, _ *http.Request) {
	r.writeJSON(w, http.StatusOK, api.HealthResponse{Status: "ok", Replica: r.id})
}

// httpReady answers 200 only while the replica serves requests: caught up
// with the event stream and not shutting down.
func (r *Replica) httpReady(w http.ResponseWriter, _ *http.Request) {
	switch st := r.state.Load(); st {
	case stateReady:
		r.writeJSON(w, http.StatusOK, api.HealthResponse{Status: "ok", Replica: r.id})
	case stateNew, stateStarting:
		r.writeJSON(w, http.StatusServiceUnavailable, api.HealthResponse{Status: "not_ready", Replica: r.id,
			Reason: "catching up with the event stream (applied seq " + strconv.FormatUint(r.intake.lastSeq.Load(), 10) + ")"})
	default:
		r.writeJSON(w, http.StatusServiceUnavailable, api.HealthResponse{Status: "shutting_down", Replica: r.id})
	}
}

func (r *Replica) httpMetrics(w http.ResponseWriter, q *http.Request) {
	if r.cfg.MetricsHandler == nil {
		r.writeError(w, q, &api.Error{Code: api.CodeNotFound, Status: 404, Message: "metrics are not enabled on this replica"})
		return
	}
	r.cfg.MetricsHandler.ServeHTTP(w, q)
}

// bodyLimit caches the route body limit derived from the registered
// workers, recomputed at most once a second.
type bodyLimit struct {
	n    atomic.Int64
	next atomic.Int64 // unix nanoseconds of the next recomputation
}

// wireBytesPerToken is the most a token id takes in a JSON body
// ("4294967295,").
const wireBytesPerToken = 11

// routeBodyLimit is the largest route body this replica reads:
// Config.MaxBodyBytes, or else the largest prompt a registered worker can
// hold (KV blocks * block size tokens, wireBytesPerToken each, plus room
// for the other fields), within [MinBodyBytes, api.MaxRouteBodySize]. A
// worker of unknown capacity (no kv_blocks) allows api.MaxRouteBodySize.
func (r *Replica) routeBodyLimit() int64 {
	if r.cfg.MaxBodyBytes > 0 {
		return r.cfg.MaxBodyBytes
	}
	now := time.Now().UnixNano()
	if n := r.bodyMax.n.Load(); n > 0 {
		next := r.bodyMax.next.Load()
		if now < next || !r.bodyMax.next.CompareAndSwap(next, now+int64(time.Second)) {
			return n // still fresh, or another request is recomputing it
		}
	} else {
		// None yet: every caller until the first is stored computes it
		// (a caller returning the unset 0 would refuse every body).
		r.bodyMax.next.Store(now + int64(time.Second))
	}
	tokens := int64(0)
	for _, ms := range r.models {
		for _, w := range *ms.workers.Load() {
			if w.KVBlocks <= 0 {
				tokens = api.MaxTokens
				break
			}
			tokens = max(tokens, int64(w.KVBlocks)*int64(max(w.BlockSize, 1)))
		}
	}
	n := min(max(tokens*wireBytesPerToken+64<<10, MinBodyBytes), api.MaxRouteBodySize)
	r.bodyMax.n.Store(n)
	return n
}
