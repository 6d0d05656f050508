package bindings

import (
	"context"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// Binding is one session's stored binding, as read from the bucket.
type Binding struct {
	Model   string
	Session string
	// Target is where the session is bound: a worker and, for
	// data-parallel workers, optionally one rank of it.
	workerref.Target
	Mode session.Mode
	// Version counts re-binds: 1 at creation, +1 per re-bind; a renewal
	// keeps it.
	Version uint64
	// Writer is the ReplicaID of the router replica that wrote this
	// revision.
	Writer string
	// Created is when the current target was bound (creation or last
	// re-bind), Renewed when this revision was written; both are the
	// writer's clock.
	Created, Renewed time.Time
	// Revision is the KV revision (stream sequence) of the entry. Every
	// write is conditional on it.
	Revision uint64
}

// Requirement is what an existing binding asks of selection. Route passes
// nil to the Selector when the session is unbound.
type Requirement struct {
	Target workerref.Target
	Mode   session.Mode
}

// Selector picks the worker for one request. It is the host's hook into the
// scheduler: req is nil when the session is unbound, otherwise the binding's
// target and mode (the mode is the requirement's strength). Route may call it
// more than once per request (a lost create or a concurrent re-bind makes it
// select again under the winner's binding; at most Config.MaxAttempts
// times); only Result.Target of the final result is where the request goes,
// so a host that books capacity inside the selector must release the
// bookings of superseded calls. req is only valid during the call.
type Selector func(ctx context.Context, req *Requirement) (workerref.Target, error)

// Liveness tells whether a worker is still a member of the fleet. A Hard
// binding to a worker that is not live is re-bound; one to a live worker is
// kept and the request rejected.
type Liveness interface {
	Live(worker string) bool
}

// LivenessFunc adapts a function to Liveness.
type LivenessFunc func(worker string) bool

// Live calls f.
func (f LivenessFunc) Live(worker string) bool { return f(worker) }

// Outcome says what Route did with the binding.
type Outcome uint8

const (
	// OutcomeNone is the zero Outcome (an error before any decision).
	OutcomeNone Outcome = iota
	// Created: the session was unbound; this request created the binding.
	Created
	// Renewed: bound to the selected worker and more than half of the idle
	// TTL had passed; the TTL was restarted by a conditional write.
	Renewed
	// Fresh: bound to the selected worker and the binding is fresh; no
	// write at all.
	Fresh
	// Rebound: the binding was moved to the selected worker (Soft, or Hard
	// whose bound worker departed).
	Rebound
	// Rejected: Hard binding to a live worker and selection picked another;
	// the binding is unchanged and Route returns an error wrapping
	// ErrHardBindingConflict.
	Rejected
	// KeptOther: Soft re-bind lost to another writer that moved the binding
	// first; their binding is kept and the request proceeds to the selected
	// worker.
	KeptOther
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"none", "created", "renewed", "fresh", "rebound", "rejected", "kept_other"}

// String returns a metric-friendly name: created, renewed, fresh, rebound,
// rejected, kept_other.
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Outcomes lists every outcome a successful or rejected Route reports, in
// order, for hosts that pre-register metric labels.
func Outcomes() []Outcome {
	return []Outcome{Created, Renewed, Fresh, Rebound, Rejected, KeptOther}
}

// Wrote reports whether the outcome involved a KV write by this call.
func (o Outcome) Wrote() bool { return o == Created || o == Renewed || o == Rebound }

// Result is what Route decided for one request.
type Result struct {
	Outcome Outcome
	// Target is where the request goes. For Created, Renewed, Fresh and
	// Rebound it is the bound worker (with the rank the selector named);
	// for KeptOther it is the selected worker, which differs from the
	// (other writer's) binding; for Rejected it is zero.
	Target workerref.Target
	// Binding is the binding as stored after the decision (for Rejected,
	// the unchanged binding; for KeptOther, the other writer's).
	Binding Binding
	// Selections is how many times the Selector was called.
	Selections int
}
