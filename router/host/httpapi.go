package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// newHTTPHandler builds the HTTP API. Every endpoint speaks JSON; errors
// are the envelope of errors.go with the status of their code.
func (r *Replica) newHTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/route", r.httpRoute)
	mux.HandleFunc("POST /v1/requests/{id}/prefill_done", r.httpLifecycle(OpPrefillDone))
	mux.HandleFunc("POST /v1/requests/{id}/cancel", r.httpLifecycle(OpCancel))
	mux.HandleFunc("DELETE /v1/requests/{id}", r.httpLifecycle(OpFree))
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
			writeError(w, &Error{Code: CodeMethodNotAllowed, Status: http.StatusMethodNotAllowed,
				Message: q.Method + " " + q.URL.Path + " is not supported (allowed: " + allow + ")"})
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, q *http.Request) {
		writeError(w, &Error{Code: CodeNotFound, Status: 404, Message: "no endpoint " + q.Method + " " + q.URL.Path})
	})
	return mux
}

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func writeError(w http.ResponseWriter, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(appendErrorJSON(nil, e))
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
		writeError(w, e)
		return
	}
	defer r.leave()
	buf := bodyPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bodyPool.Put(buf)
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, q.Body, MaxRouteBodySize)); err != nil {
		var mb *http.MaxBytesError
		e := badField("body", "unreadable: %v", err)
		if errors.As(err, &mb) {
			e = badField("body", "is larger than %d bytes", MaxRouteBodySize)
		}
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		writeError(w, e)
		return
	}
	s := r.getScratch()
	defer r.putScratch(s)
	if derr := DecodeRouteRequest(buf.Bytes(), &s.req); derr != nil {
		e := asAPIError(derr)
		r.m.badRequests.Add(ctx, 1, attr(fieldAttr(e.Field)))
		r.m.routes.Add(ctx, 1, r.m.codeOpt(e.Code))
		writeError(w, e)
		return
	}
	spanCtx := ctx
	err := r.routeTraced(&spanCtx, &s.req, &s.resp, s)
	if sc := trace.SpanContextFromContext(spanCtx); sc.IsValid() {
		r.prop.Inject(spanCtx, propagation.HeaderCarrier(w.Header()))
	}
	if err != nil {
		writeError(w, asAPIError(err))
		return
	}
	s.out = AppendRouteResponse(s.out[:0], &s.resp)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(s.out)))
	if _, err := w.Write(s.out); err != nil {
		// The client is gone and will not use the booking.
		if ms, ok := r.models[s.resp.Model]; ok {
			if fe, ok := ms.fences.get(s.resp.RequestID); ok {
				r.rollback(ms, fe)
			}
		}
	}
}

// httpLifecycle serves POST /v1/requests/{id}/prefill_done,
// POST /v1/requests/{id}/cancel and DELETE /v1/requests/{id} (free). The
// optional JSON body or the query (?model=&attempt=&replica=) name the
// model, attempt and owning replica.
func (r *Replica) httpLifecycle(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, q *http.Request) {
		ctx := r.httpCtx(q)
		var lr LifecycleRequest
		body, err := io.ReadAll(http.MaxBytesReader(w, q.Body, 64<<10))
		if err != nil {
			writeError(w, badField("body", "unreadable: %v", err))
			return
		}
		if len(bytes.TrimSpace(body)) > 0 {
			if err := json.Unmarshal(body, &lr); err != nil {
				writeError(w, badField("body", "invalid JSON: %v", err))
				return
			}
		}
		id := q.PathValue("id")
		if lr.RequestID != "" && lr.RequestID != id {
			writeError(w, badField("request_id", "%q in the body differs from %q in the path", lr.RequestID, id))
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
				writeError(w, badField("attempt", "%q is not a non-negative integer", v))
				return
			}
			lr.Attempt = a
		}
		if op == OpFree && qv.Get("reason") == "cancel" {
			op = OpCancel
		}
		resp, err := r.Lifecycle(ctx, op, &lr)
		if err != nil {
			writeError(w, asAPIError(err))
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

func (r *Replica) httpWorkers(w http.ResponseWriter, q *http.Request) {
	resp, err := r.Workers(q.URL.Query().Get("model"))
	if err != nil {
		writeError(w, asAPIError(err))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (r *Replica) httpSession(w http.ResponseWriter, q *http.Request) {
	resp, err := r.Session(r.httpCtx(q), q.URL.Query().Get("model"), q.PathValue("id"))
	if err != nil {
		writeError(w, asAPIError(err))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (r *Replica) httpEndSession(w http.ResponseWriter, q *http.Request) {
	id := q.PathValue("id")
	if err := r.EndSession(r.httpCtx(q), q.URL.Query().Get("model"), id); err != nil {
		writeError(w, asAPIError(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"v": APIVersion, "session_id": id, "ended": true})
}

// httpHealth answers 200 while the process runs (liveness).
func (r *Replica) httpHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, HealthResponse{Status: "ok", Replica: r.id})
}

// httpReady answers 200 only while the replica serves requests: caught up
// with the event stream and not shutting down.
func (r *Replica) httpReady(w http.ResponseWriter, _ *http.Request) {
	switch st := r.state.Load(); st {
	case stateReady:
		writeJSON(w, http.StatusOK, HealthResponse{Status: "ok", Replica: r.id})
	case stateNew, stateStarting:
		writeJSON(w, http.StatusServiceUnavailable, HealthResponse{Status: "not_ready", Replica: r.id,
			Reason: "catching up with the event stream (applied seq " + strconv.FormatUint(r.eventSink.lastSeq.Load(), 10) + ")"})
	default:
		writeJSON(w, http.StatusServiceUnavailable, HealthResponse{Status: "shutting_down", Replica: r.id})
	}
}

func (r *Replica) httpMetrics(w http.ResponseWriter, q *http.Request) {
	if r.cfg.MetricsHandler == nil {
		writeError(w, &Error{Code: CodeNotFound, Status: 404, Message: "metrics are not enabled on this replica"})
		return
	}
	r.cfg.MetricsHandler.ServeHTTP(w, q)
}
