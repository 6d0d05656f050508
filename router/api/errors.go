package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Error codes in the error envelope. Each maps to one HTTP status; the NATS
// API sends the same envelope with the status in the body and in the
// Kvr-Status header.
const (
	CodeBadRequest       = "bad_request"        // 400: a field is missing, malformed or out of range
	CodeNotFound         = "not_found"          // 404: unknown session or request (or a wrong fence)
	CodeUnauthorized     = "unauthorized"       // 401 (HTTP only): a missing or wrong bearer token
	CodeExceedsCapacity  = "exceeds_capacity"   // 400: the request needs more KV than the largest worker holds
	CodePinConflict      = "pin_conflict"       // 409: pin disagrees with the session's binding
	CodeBindingRejected  = "binding_rejected"   // 409: Hard binding to a live worker that cannot take the request
	CodeNoEligibleWorker = "no_eligible_worker" // 503: no known, allowed, available worker
	CodeNotReady         = "not_ready"          // 503: replica still catching up with the event stream
	CodeShuttingDown     = "shutting_down"      // 503: replica is draining
	// CodeBindingsUnavailable, 503: the session bindings table did not
	// answer within the request's deadline (a bindings stream leader
	// election); retryable, with retry_after_ms and Retry-After.
	CodeBindingsUnavailable = "bindings_unavailable"
	CodeOverloaded          = "overloaded"         // 529: queue full or queue wait exceeded the deadline
	CodeMethodNotAllowed    = "method_not_allowed" // 405 (HTTP only): a known path with another method
	CodeCanceled            = "canceled"           // 499: the request was canceled (cancel call or caller gone)
	// CodePayloadTooLarge, 413 (Client only, never sent by a replica):
	// the route request does not fit in one NATS message of the server's
	// max_payload, even as block hashes; it was not sent.
	CodePayloadTooLarge = "payload_too_large"
	CodeInternal        = "internal" // 500: a bug or an unexpected dependency failure
)

// StatusOverloaded is the HTTP status for an overloaded router (not in
// net/http: it is the de facto "site is overloaded" code).
const StatusOverloaded = 529

// StatusCanceled is the status of a request canceled by its client while it
// waited (nginx's "client closed request").
const StatusCanceled = 499

// StatusOf maps an error code to its HTTP status.
func StatusOf(code string) int {
	switch code {
	case CodeBadRequest, CodeExceedsCapacity:
		return http.StatusBadRequest
	case CodeUnauthorized:
		return http.StatusUnauthorized
	case CodeNotFound:
		return http.StatusNotFound
	case CodePinConflict, CodeBindingRejected:
		return http.StatusConflict
	case CodeNoEligibleWorker, CodeNotReady, CodeShuttingDown, CodeBindingsUnavailable:
		return http.StatusServiceUnavailable
	case CodeOverloaded:
		return StatusOverloaded
	case CodeCanceled:
		return StatusCanceled
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusInternalServerError
}

// Sentinel errors, tested with errors.Is. An *Error wraps one of them.
var (
	ErrBadRequest          = errors.New("bad request")
	ErrNotFound            = errors.New("not found")
	ErrUnauthorized        = errors.New("unauthorized")
	ErrExceedsCapacity     = errors.New("request exceeds every worker's capacity")
	ErrPinConflict         = errors.New("pin conflicts with the session binding")
	ErrBindingRejected     = errors.New("session bound to a live worker that cannot take the request")
	ErrNoEligibleWorker    = errors.New("no eligible worker")
	ErrNotReady            = errors.New("replica not ready")
	ErrShuttingDown        = errors.New("replica shutting down")
	ErrBindingsUnavailable = errors.New("session bindings unavailable")
	ErrOverloaded          = errors.New("overloaded")
	ErrCanceled            = errors.New("request canceled")
	ErrPayloadTooLarge     = errors.New("route request larger than the NATS server's max_payload")
	ErrInternal            = errors.New("internal error")
)

var sentinelOf = map[string]error{
	CodeBadRequest:          ErrBadRequest,
	CodeNotFound:            ErrNotFound,
	CodeUnauthorized:        ErrUnauthorized,
	CodeExceedsCapacity:     ErrExceedsCapacity,
	CodePinConflict:         ErrPinConflict,
	CodeBindingRejected:     ErrBindingRejected,
	CodeNoEligibleWorker:    ErrNoEligibleWorker,
	CodeNotReady:            ErrNotReady,
	CodeShuttingDown:        ErrShuttingDown,
	CodeBindingsUnavailable: ErrBindingsUnavailable,
	CodeOverloaded:          ErrOverloaded,
	CodeCanceled:            ErrCanceled,
	CodePayloadTooLarge:     ErrPayloadTooLarge,
	CodeInternal:            ErrInternal,
}

// Error is an API error: a code, its HTTP status, the field at fault (for
// bad_request) and a message for people. It is what both transports send in
// the error envelope, and what a client decodes from one.
type Error struct {
	Code    string `json:"code"`
	Status  int    `json:"status"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	// RetryAfterMS, when > 0, is how long the client should wait before
	// retrying (HTTP also sends it as Retry-After, in whole seconds).
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
	cause        error
}

// RetryAfterSeconds is the Retry-After header value of e (its
// RetryAfterMS rounded up to whole seconds), or "" when e sets none.
func (e *Error) RetryAfterSeconds() string {
	if e.RetryAfterMS <= 0 {
		return ""
	}
	return strconv.FormatInt((e.RetryAfterMS+999)/1000, 10)
}

func (e *Error) Error() string {
	if e.Field != "" {
		return e.Code + ": " + e.Field + ": " + e.Message
	}
	return e.Code + ": " + e.Message
}

// Unwrap returns the code's sentinel and the underlying cause, so both
// errors.Is(err, host.ErrPinConflict) and errors.Is(err, scheduler.Err...)
// hold.
func (e *Error) Unwrap() []error {
	var out []error
	if s, ok := sentinelOf[e.Code]; ok {
		out = append(out, s)
	}
	if e.cause != nil {
		out = append(out, e.cause)
	}
	return out
}

// NewError builds an *Error with the status of code; cause (may be nil) is
// what errors.Is and errors.As also find behind it.
func NewError(code, msg string, cause error) *Error {
	return &Error{Code: code, Status: StatusOf(code), Message: msg, cause: cause}
}

// OnField sets the field at fault and returns e.
func (e *Error) OnField(field string) *Error {
	e.Field = field
	return e
}

// BadField reports a bad_request naming the field and the reason.
func BadField(field, format string, args ...any) *Error {
	return &Error{Code: CodeBadRequest, Status: http.StatusBadRequest, Field: field, Message: fmt.Sprintf(format, args...)}
}

// errorEnvelope is the JSON body of every error: {"error": {...}}.
type errorEnvelope struct {
	Error *Error `json:"error"`
}

// isEnvelope reports whether data starts as an error envelope does:
// '{', then the key "error", white space allowed around both.
func isEnvelope(data []byte) bool {
	d := decoder{buf: data}
	if d.peek() != '{' {
		return false
	}
	d.pos++
	d.skipWS()
	return bytes.HasPrefix(data[d.pos:], []byte(`"error"`))
}

// AppendError appends the envelope of e to dst.
func AppendError(dst []byte, e *Error) []byte {
	dst = append(dst, `{"error":{"code":`...)
	dst = strconv.AppendQuote(dst, e.Code)
	dst = append(dst, `,"status":`...)
	dst = strconv.AppendInt(dst, int64(e.Status), 10)
	if e.Field != "" {
		dst = append(dst, `,"field":`...)
		dst = AppendJSONString(dst, e.Field)
	}
	dst = append(dst, `,"message":`...)
	dst = AppendJSONString(dst, e.Message)
	if e.RetryAfterMS > 0 {
		dst = append(dst, `,"retry_after_ms":`...)
		dst = strconv.AppendInt(dst, e.RetryAfterMS, 10)
	}
	return append(dst, "}}"...)
}

// DecodeError returns the *Error in an error envelope, or nil when data is
// not one. Clients use it on every reply: a reply is either the expected
// message or an envelope.
func DecodeError(data []byte) *Error {
	// Cheap test first: an envelope's one key is "error", and no success
	// body starts with it.
	if !isEnvelope(data) {
		return nil
	}
	var env errorEnvelope
	if json.Unmarshal(data, &env) != nil || env.Error == nil || env.Error.Code == "" {
		return nil
	}
	if env.Error.Status == 0 {
		env.Error.Status = StatusOf(env.Error.Code)
	}
	return env.Error
}
