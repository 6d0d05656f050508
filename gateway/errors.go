package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/kvrouter/kvrouter/router/api"
)

// errorBody is OpenAI's error shape:
// {"error": {"message", "type", "param", "code"}}.
type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// typeOf is OpenAI's error type for an HTTP status.
func typeOf(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "invalid_request_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

func (e *RequestError) body() errorBody {
	b := errorBody{Error: errorInfo{Message: e.Message, Type: typeOf(e.Status), Code: e.Code}}
	if e.Param != "" {
		p := e.Param
		b.Error.Param = &p
	}
	return b
}

func notFound(code, format string, args ...any) *RequestError {
	e := badRequest("", format, args...)
	e.Status, e.Code = http.StatusNotFound, code
	return e
}

func serverError(status int, code, format string, args ...any) *RequestError {
	e := badRequest("", format, args...)
	e.Status, e.Code = status, code
	return e
}

// Retry-After, in seconds, on a 429 (the router was overloaded) and on a
// 503 bindings_unavailable (the router's session bindings did not answer
// in time; the router itself asks for 1 s, host.BindingsRetryAfter).
const retryAfterSeconds = 1

// routeError maps a route call's failure to the client's answer: the
// router's 529 becomes 429 with Retry-After, no eligible worker (or no
// router) 503, bindings that did not answer in time 503 with Retry-After,
// a Hard binding that cannot take the request 409, and a caller that went
// away 499, a prompt too long for one NATS message even as block hashes
// 413 payload_too_large.
func routeError(ctx context.Context, err error) *RequestError {
	var ae *api.Error
	switch {
	case ctx.Err() != nil:
		return serverError(api.StatusCanceled, "canceled", "the client closed the request while it was routed")
	case errors.As(err, &ae):
		switch ae.Code {
		case api.CodeOverloaded:
			return serverError(http.StatusTooManyRequests, "router_overloaded", "the router is overloaded: %s", ae.Message)
		case api.CodeBindingsUnavailable:
			return serverError(http.StatusServiceUnavailable, ae.Code, "the router could not reach its session bindings in time: %s", ae.Message)
		case api.CodeNoEligibleWorker, api.CodeNotReady, api.CodeShuttingDown:
			return serverError(http.StatusServiceUnavailable, ae.Code, "no worker can take the request: %s", ae.Message)
		case api.CodeBindingRejected, api.CodePinConflict:
			return serverError(http.StatusConflict, ae.Code, "%s", ae.Message)
		case api.CodeBadRequest:
			e := badRequest(ae.Field, "%s", ae.Message)
			return e
		case api.CodePayloadTooLarge:
			return serverError(http.StatusRequestEntityTooLarge, ae.Code, "the prompt is too long to route: %s", ae.Message)
		}
		return serverError(http.StatusInternalServerError, "router_error", "route failed: %s", ae.Message)
	case errors.Is(err, api.ErrNoRouter):
		return serverError(http.StatusServiceUnavailable, "no_router", "no router replica answered: %v", err)
	}
	return serverError(http.StatusInternalServerError, "router_error", "route failed: %v", err)
}

// writeError answers the client with e in OpenAI's shape.
func (g *Gateway) writeError(ctx context.Context, w http.ResponseWriter, e *RequestError) {
	if ra := e.RetryAfter(); ra > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ra))
	}
	g.setWriteDeadline(w)
	writeJSON(w, e.Status, e.body())
	g.m.answered(ctx, e.Status)
}

func writeJSONTo(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}
