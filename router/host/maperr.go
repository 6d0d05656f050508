package host

import (
	"context"
	"errors"
)

// mapError maps errors of the other packages to API errors. It is the one
// table that decides which dependency failure a client sees as which code.
func mapError(err error) *Error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return newError(CodeOverloaded, "deadline exceeded while waiting: "+err.Error(), err)
	case errors.Is(err, context.Canceled):
		return newError(CodeShuttingDown, "request canceled: "+err.Error(), err)
	}
	return newError(CodeInternal, err.Error(), err)
}
