package host

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workerref"
)

// pinBindingError is the scheduler's ErrPinConflict for a request whose pin
// disagrees with its session's binding, with what the API error names.
type pinBindingError struct {
	pin     workerref.Target
	session string
	binding bindings.Requirement
	err     error
}

func (e *pinBindingError) Error() string {
	return "pin " + e.pin.String() + " disagrees with session " + strconv.Quote(e.session) + "'s binding: " + e.err.Error()
}

func (e *pinBindingError) Unwrap() error { return e.err }

// BindingsRetryAfter is the Retry-After of bindings_unavailable: a
// bindings stream leader election on a 3-node cluster takes a few seconds,
// and clients retrying every second are served as soon as it is over.
const BindingsRetryAfter = time.Second

// bindingsUnavailableError: the bindings table did not answer a session's
// read or commit within the route's deadline (selectAndBind tells it from
// a scheduler failure passed through the table).
type bindingsUnavailableError struct {
	session string
	err     error
}

func (e *bindingsUnavailableError) Error() string {
	return "session " + strconv.Quote(e.session) + ": bindings table did not answer: " + e.err.Error()
}

func (e *bindingsUnavailableError) Unwrap() error { return e.err }

// bindingsUnanswered reports whether err from the bindings table means it
// could not answer in time: its stream leader did not answer
// (bindings.ErrUnavailable), the route's deadline passed, or a write's
// outcome is unknown.
func bindingsUnanswered(err error) bool {
	return errors.Is(err, bindings.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, bindings.ErrAmbiguous)
}

// mapError turns any error into an API error: an *api.Error is returned as
// is, errors of the other packages are mapped here. It is the one table that
// decides which dependency failure a client sees as which code and message;
// anything unknown is internal.
func mapError(err error) *api.Error {
	var (
		ae  *api.Error
		pbe *pinBindingError
		hce *bindings.HardConflictError
		ce  *scheduler.CapacityError
		bue *bindingsUnavailableError
	)
	code := api.CodeInternal
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &pbe):
		return api.NewError(api.CodePinConflict, "pin "+pbe.pin.String()+" disagrees with session "+strconv.Quote(pbe.session)+
			" bound ("+pbe.binding.Mode.String()+") to "+pbe.binding.Target.String()+"; end the session or drop the pin", err).OnField("pin")
	case errors.As(err, &hce):
		return api.NewError(api.CodeBindingRejected, "session "+strconv.Quote(hce.Session)+" is bound (hard) to live worker "+hce.Bound.String()+
			", which cannot take the request now (selection picked "+hce.Selected.String()+"); retry later or end the session", err)
	case errors.As(err, &ce):
		field := "input_tokens"
		if ce.ExpectedOutput > 0 {
			field = "expected_output_tokens"
		}
		return api.NewError(api.CodeExceedsCapacity, ce.Error(), err).OnField(field)
	case errors.As(err, &bue):
		e := api.NewError(api.CodeBindingsUnavailable, "session "+strconv.Quote(bue.session)+
			": the session bindings table did not answer within the request's deadline (a bindings leader election?); retry", err)
		e.RetryAfterMS = BindingsRetryAfter.Milliseconds()
		return e
	case errors.Is(err, bindings.ErrUnavailable):
		// A session read (not a route) whose leader read got no answer.
		e := api.NewError(api.CodeBindingsUnavailable, err.Error()+"; retry", err)
		e.RetryAfterMS = BindingsRetryAfter.Milliseconds()
		return e
	case errors.Is(err, bindings.ErrFull):
		code = api.CodeOverloaded // the message names the bucket's limit
	case errors.Is(err, scheduler.ErrNoEligibleWorker), errors.Is(err, scheduler.ErrNoCandidate):
		code = api.CodeNoEligibleWorker
	case errors.Is(err, scheduler.ErrOverloaded), errors.Is(err, scheduler.ErrDeadline),
		errors.Is(err, context.DeadlineExceeded):
		code = api.CodeOverloaded
	case errors.Is(err, scheduler.ErrPinConflict):
		code = api.CodePinConflict
	case errors.Is(err, bindings.ErrHardBindingConflict):
		code = api.CodeBindingRejected
	case errors.Is(err, scheduler.ErrInvalidRequest), errors.Is(err, bindings.ErrInvalidSession),
		errors.Is(err, bindings.ErrInvalidModel):
		return api.NewError(api.CodeBadRequest, err.Error(), err).OnField(fieldOf(err))
	case errors.Is(err, scheduler.ErrDuplicateRequest):
		return api.NewError(api.CodeBadRequest, "request id already queued or booked: "+err.Error(), err).OnField("request_id")
	case errors.Is(err, scheduler.ErrUnknownBooking), errors.Is(err, scheduler.ErrUnknownRequest),
		errors.Is(err, scheduler.ErrStaleFence), errors.Is(err, bindings.ErrNotFound):
		code = api.CodeNotFound
	case errors.Is(err, scheduler.ErrCanceled), errors.Is(err, context.Canceled):
		code = api.CodeCanceled
	case errors.Is(err, scheduler.ErrClosed), errors.Is(err, bindings.ErrClosed):
		code = api.CodeShuttingDown
	case errors.Is(err, bindings.ErrTooManyConflicts), errors.Is(err, bindings.ErrAmbiguous):
		code = api.CodeOverloaded // contention or a leader change: retry
	}
	return api.NewError(code, err.Error(), err)
}

// refusedOutcome is the binding outcome of a request the binding refused
// (for kvr_binding_outcomes_total), or "" for any other error.
func refusedOutcome(err error) string {
	var pbe *pinBindingError
	switch {
	case errors.As(err, &pbe):
		return api.OutcomeConflict
	case errors.Is(err, bindings.ErrHardBindingConflict):
		return api.OutcomeRejected
	}
	return ""
}

func fieldOf(err error) string {
	switch {
	case errors.Is(err, bindings.ErrInvalidSession):
		return "session_id"
	case errors.Is(err, bindings.ErrInvalidModel):
		return "model"
	}
	return "body"
}
