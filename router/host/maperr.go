package host

import (
	"context"
	"errors"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/router/scheduler"
)

// mapError maps errors of the other packages to API errors. It is the one
// table that decides which dependency failure a client sees as which code.
func mapError(err error) *Error {
	code := CodeInternal
	switch {
	case err == nil:
		return nil
	case errors.Is(err, scheduler.ErrNoEligibleWorker), errors.Is(err, scheduler.ErrNoCandidate):
		code = CodeNoEligibleWorker
	case errors.Is(err, scheduler.ErrOverloaded), errors.Is(err, scheduler.ErrDeadline),
		errors.Is(err, context.DeadlineExceeded):
		code = CodeOverloaded
	case errors.Is(err, scheduler.ErrPinConflict):
		code = CodePinConflict
	case errors.Is(err, bindings.ErrHardBindingConflict):
		code = CodeBindingRejected
	case errors.Is(err, scheduler.ErrInvalidRequest), errors.Is(err, bindings.ErrInvalidSession),
		errors.Is(err, bindings.ErrInvalidModel):
		e := newError(CodeBadRequest, err.Error(), err)
		e.Field = fieldOf(err)
		return e
	case errors.Is(err, scheduler.ErrDuplicateRequest):
		e := newError(CodeBadRequest, "request id already queued or booked: "+err.Error(), err)
		e.Field = "request_id"
		return e
	case errors.Is(err, scheduler.ErrUnknownBooking), errors.Is(err, scheduler.ErrUnknownRequest),
		errors.Is(err, scheduler.ErrStaleFence), errors.Is(err, bindings.ErrNotFound):
		code = CodeNotFound
	case errors.Is(err, scheduler.ErrCanceled), errors.Is(err, context.Canceled):
		code = CodeCanceled
	case errors.Is(err, scheduler.ErrClosed), errors.Is(err, bindings.ErrClosed):
		code = CodeShuttingDown
	case errors.Is(err, bindings.ErrTooManyConflicts), errors.Is(err, bindings.ErrAmbiguous):
		code = CodeOverloaded // contention or a leader change: retry
	}
	return newError(code, err.Error(), err)
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
