package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"

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
	return mux
}

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// writeError answers with an error envelope. Every error an HTTP client
// gets passes here, so bad requests are counted here.
func (r *Replica) writeError(w http.ResponseWriter, q *http.Request, e *api.Error) {
	r.countBad(q.Context(), e)
	w.Header().Set("Content-Type", "application/json")
	if ra := e.RetryAfterSeconds(); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(api.AppendError(nil, e))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
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
	if e := r.enter(); e != nil {
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		r.writeError(w, q, e)
		return
	}
	defer r.leave()
	buf := bodyPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bodyPool.Put(buf)
	s := r.getScratch()
	defer r.putScratch(s)
	err := readBody(buf, w, q, api.MaxRouteBodySize)
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
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(s.out)))
	if _, err := w.Write(s.out); err != nil {
		r.rollbackReply(&s.resp) // the client is gone and will not use the booking
	}
}

// readBody reads q's body into buf, at most limit bytes; a longer or
// unreadable body is a bad_request on field body.
func readBody(buf *bytes.Buffer, w http.ResponseWriter, q *http.Request, limit int64) error {
	_, err := buf.ReadFrom(http.MaxBytesReader(w, q.Body, limit))
	var mb *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &mb):
		return api.BadField("body", "is larger than %d bytes", limit)
	}
	return api.BadField("body", "unreadable: %v", err)
}

// httpLifecycle serves POST /v1/requests/{id}/prefill_done,
// POST /v1/requests/{id}/cancel and DELETE /v1/requests/{id} (free). The
// optional JSON body or the query (?model=&attempt=&replica=) name the
// model, attempt and owning replica.
func (r *Replica) httpLifecycle(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, q *http.Request) {
		ctx := r.httpCtx(q)
		var lr api.LifecycleRequest
		var body bytes.Buffer
		err := readBody(&body, w, q, api.MaxLifecycleBodySize)
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
		writeJSON(w, http.StatusOK, resp)
	}
}

func (r *Replica) httpWorkers(w http.ResponseWriter, q *http.Request) {
	resp, err := r.Workers(q.URL.Query().Get("model"))
	if err != nil {
		r.writeError(w, q, mapError(err))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (r *Replica) httpSession(w http.ResponseWriter, q *http.Request) {
	resp, err := r.Session(r.httpCtx(q), q.URL.Query().Get("model"), q.PathValue("id"))
	if err != nil {
		r.writeError(w, q, mapError(err))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (r *Replica) httpEndSession(w http.ResponseWriter, q *http.Request) {
	id := q.PathValue("id")
	if err := r.EndSession(r.httpCtx(q), q.URL.Query().Get("model"), id); err != nil {
		r.writeError(w, q, mapError(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"v": api.APIVersion, "session_id": id, "ended": true})
}

// httpHealth answers 200 while the process runs (liveness).
func (r *Replica) httpHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.HealthResponse{Status: "ok", Replica: r.id})
}

// httpReady answers 200 only while the replica serves requests: caught up
// with the event stream and not shutting down.
func (r *Replica) httpReady(w http.ResponseWriter, _ *http.Request) {
	switch st := r.state.Load(); st {
	case stateReady:
		writeJSON(w, http.StatusOK, api.HealthResponse{Status: "ok", Replica: r.id})
	case stateNew, stateStarting:
		writeJSON(w, http.StatusServiceUnavailable, api.HealthResponse{Status: "not_ready", Replica: r.id,
			Reason: "catching up with the event stream (applied seq " + strconv.FormatUint(r.eventSink.lastSeq.Load(), 10) + ")"})
	default:
		writeJSON(w, http.StatusServiceUnavailable, api.HealthResponse{Status: "shutting_down", Replica: r.id})
	}
}

func (r *Replica) httpMetrics(w http.ResponseWriter, q *http.Request) {
	if r.cfg.MetricsHandler == nil {
		r.writeError(w, q, &api.Error{Code: api.CodeNotFound, Status: 404, Message: "metrics are not enabled on this replica"})
		return
	}
	r.cfg.MetricsHandler.ServeHTTP(w, q)
}
