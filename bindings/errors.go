package bindings

import (
	"errors"
	"fmt"

	"github.com/kvrouter/kvrouter/workerref"
)

// Sentinel errors. Errors returned by the package wrap one of these (test
// with errors.Is) and name the session, key or value concerned.
var (
	// ErrInvalidSession: empty session id, or longer than MaxSessionLen bytes.
	ErrInvalidSession = errors.New("bindings: invalid session id")
	// ErrInvalidModel: model name longer than MaxModelLen bytes.
	ErrInvalidModel = errors.New("bindings: invalid model name")
	// ErrMalformedValue: the stored value cannot be decoded or is
	// inconsistent with its key. Route never overwrites it; End removes it.
	ErrMalformedValue = errors.New("bindings: malformed binding value")
	// ErrConflict: a conditional write lost (JetStream codes 10071 and 10164,
	// or the KV client's ErrKeyExists / ErrKeyRevisionMismatch).
	ErrConflict = errors.New("bindings: write conflict")
	// ErrTooManyConflicts: Route lost MaxAttempts rounds in a row. It also
	// wraps ErrConflict.
	ErrTooManyConflicts = errors.New("bindings: too many conflicts")
	// ErrHardBindingConflict: a Hard binding names a live worker and
	// selection picked another. The binding is left as it is.
	ErrHardBindingConflict = errors.New("bindings: hard binding conflict")
	// ErrAmbiguous: a write's outcome could not be learnt from the stream
	// leader before the caller's deadline or Config.ResolveTimeout. Nothing
	// is assumed; the request should fail. When the cause is that the
	// leader did not answer, the error also matches ErrUnavailable.
	ErrAmbiguous = errors.New("bindings: write outcome unknown")
	// ErrUnavailable: the stream leader gave no answer in time (before the
	// caller's deadline, or Config.ResolveTimeout without one) to a leader
	// read, to a write's resolution or while a write was in flight: a
	// leader election, a cluster without quorum. Retrying later is safe.
	// The concrete error is an *UnavailableError; it also matches its
	// cause (e.g. context.DeadlineExceeded), so test for it first.
	ErrUnavailable = errors.New("bindings: stream leader unavailable")
	// ErrFull: the bucket refused a new binding because it holds
	// Config.MaxSessions entries or Config.MaxBytes bytes. The concrete
	// error is a *FullError.
	ErrFull = errors.New("bindings: bucket full")
	// ErrNotFound: the session has no binding.
	ErrNotFound = errors.New("bindings: no binding")
	// ErrNilSelector: Route was called without a Selector.
	ErrNilSelector = errors.New("bindings: nil selector")
	// ErrBucketConfig: the existing bucket lacks per-key TTL or keeps more
	// than one revision per key.
	ErrBucketConfig = errors.New("bindings: unsuitable bucket configuration")
	// ErrClosed: the table was closed.
	ErrClosed = errors.New("bindings: table closed")
	// ErrSelect wraps an error returned by the Selector (the selector's
	// own error is wrapped too, so errors.Is works for both).
	ErrSelect = errors.New("bindings: selection failed")
)

// HardConflictError is returned (wrapping ErrHardBindingConflict) when a
// request of a Hard-bound session was selected elsewhere while the bound
// worker is live.
type HardConflictError struct {
	Model, Session string
	Bound          workerref.Target
	Selected       workerref.Target
}

func (e *HardConflictError) Error() string {
	return fmt.Sprintf("bindings: hard binding conflict: session %q (model %q) is bound to live worker %q, selection picked %q",
		e.Session, e.Model, e.Bound.String(), e.Selected.String())
}

// Unwrap returns ErrHardBindingConflict.
func (e *HardConflictError) Unwrap() error { return ErrHardBindingConflict }

// MalformedValueError is returned (wrapping ErrMalformedValue and the
// decoding cause) when a stored value cannot be used.
type MalformedValueError struct {
	Key      string
	Revision uint64
	Err      error
}

func (e *MalformedValueError) Error() string {
	return fmt.Sprintf("bindings: malformed binding value at key %q revision %d: %v", e.Key, e.Revision, e.Err)
}

// Unwrap returns ErrMalformedValue and the cause.
func (e *MalformedValueError) Unwrap() []error { return []error{ErrMalformedValue, e.Err} }

// UnavailableError is returned (wrapping ErrUnavailable and the cause) when
// the stream leader did not answer in time.
type UnavailableError struct {
	Op  string // "leader read", "wait for an in-flight write", ...
	Key string
	Err error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("bindings: stream leader unavailable: %s of key %q: %v", e.Op, e.Key, e.Err)
}

// Unwrap returns ErrUnavailable and the cause.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }

// FullError is returned (wrapping ErrFull and the server's error) when the
// server refused a write because the bucket reached a limit.
type FullError struct {
	Bucket string
	// Sessions is the entry limit (MaxSessions) when that was reached;
	// Bytes the byte limit (MaxBytes) otherwise.
	Sessions, Bytes int64
	Err             error
}

func (e *FullError) Error() string {
	if e.Bytes > 0 {
		return fmt.Sprintf("bindings: bucket %q full: %d bytes", e.Bucket, e.Bytes)
	}
	return fmt.Sprintf("bindings: bucket %q full: %d sessions", e.Bucket, e.Sessions)
}

// Unwrap returns ErrFull and the server's error.
func (e *FullError) Unwrap() []error { return []error{ErrFull, e.Err} }
