package scheduler

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// Affinity is a requirement to route to a target: a session binding (its
// strength is the binding's mode, as stored) or an explicit target given on
// the wire as a routing preference (always Soft). Hard limits selection to
// the target while it is eligible; Soft hands the target to the policy as a
// preference. Mode session.Unset is invalid, so a host that forgets to set
// it is told so instead of silently getting one or the other.
type Affinity struct {
	Target workerref.Target
	Mode   session.Mode
}

// Overlap is how many leading prompt blocks a (worker, rank) already holds
// in its device cache, as the prefix index reports it. The scheduler has its
// own type so that it does not depend on the index package.
//
// Reported is how many of them the engines' own KV events report (the
// event-fed index); the rest the replica only predicts from its own
// routing (the predicted index). The default cost can credit the two
// differently (CostParams.ReportedCredit). A key may appear more than once
// (one entry per index): the scheduler takes the largest Blocks and the
// largest Reported of each key.
type Overlap struct {
	Key      workerref.Target
	Blocks   int
	Reported int
}

// Request is one scheduling request. The scheduler reads it until Schedule
// returns and keeps nothing that aliases it afterwards (the booking copies
// the sequence hashes it needs).
type Request struct {
	ID             string             // unique among requests with a live booking or a queue place
	Model          string             // checked against Config.Model when both are set
	SeqHashes      []kvevents.SeqHash // the prompt's full-block sequence hashes, in order
	Tokens         int                // prompt tokens (ISL)
	ExpectedOutput int                // expected output tokens (booked as decode blocks)
	Priority       int                // strict tier: a higher value is always served first
	Class          string             // queue-limit class; "" is the default class
	Allowed        []string           // worker names the caller allows; nil = every worker
	Pinned         *workerref.Target  // explicit exact target with its own queue lane (narrowed to an agreeing affinity's rank)
	SessionID      string             // informational for policies
	RoutingKey     string             // what prefix-hashing policies key on (chwbl: the first user message); "" = the prompt's first blocks
	Affinity       *Affinity          // session binding or wire preference
	Deadline       time.Time          // zero = wait as long as ctx allows
	Overlaps       []Overlap          // per-worker cached prefix blocks
	Labels         map[string]string  // free-form input for classifiers and custom policies
	// Adapter is the LoRA adapter the request runs with ("" = the base
	// model); AdapterResident lists the workers that hold it on their GPU
	// (the default cost charges the others a load: adapters.go).
	Adapter         string
	AdapterResident []string
	// Leg is the part of a prefill/decode-disaggregated request this
	// scheduling request is for (LegWhole: not split). It limits the
	// candidates by role (Role.Serves) and, for LegDecode under the default
	// policy, selects by the decode cost (pd.go). A LegDecode booking on a
	// decode-only worker charges it no prefill tokens (its engine pulls the
	// prompt; Scheduler.ServeWhole moves them).
	Leg Leg
	// NoWait refuses the request with ErrWouldQueue, at once and booking
	// nothing, where it would wait in the queue because every worker it
	// could use is busy: a caller that has somewhere else to go (a PD
	// route's local prefill, host/pd.go) asks before it waits.
	NoWait bool
}

// Fence identifies one booking: a request on a worker at one attempt. A
// lifecycle call (PrefillDone, Free, Rollback) must present the fence it was
// given, so cleanup from an earlier attempt cannot release a retry.
type Fence struct {
	RequestID string
	Worker    workerref.Target
	Attempt   uint64
}

// String renders request@worker/rank#attempt.
func (f Fence) String() string {
	return fmt.Sprintf("%s@%s#%d", f.RequestID, f.Worker, f.Attempt)
}

// Decision is the result of Schedule: where the request goes and the fence
// of the load booked there.
type Decision struct {
	Worker        workerref.Target
	OverlapBlocks int           // cached blocks on the chosen worker, as last seen
	Fence         Fence         // present it to PrefillDone / Free / Rollback
	Waited        time.Duration // time spent in the router's queue
	// HardFallback is set when the request carried a Hard requirement whose
	// target was not eligible, so selection ran over the fleet. The host's
	// commit decides what that means for the binding (re-bind or reject).
	HardFallback bool
	// Policy is the name of the policy that picked the worker.
	Policy string
}

// WorkerInfo describes one (worker, rank) to the scheduler.
type WorkerInfo struct {
	Key              workerref.Target
	BlockSize        int  // 0 = Config.BlockSize; otherwise must equal it
	KVBlocks         int  // device KV blocks; 0 = unknown (decode thresholds off)
	MaxBatchedTokens int  // engine's max batched tokens; 0 = unknown (prefill thresholds off)
	MaxSeqs          int  // engine's max concurrent sequences; 0 = unknown
	Available        bool // registered and not draining
	// Draining: not Available, but still serving the sessions bound to it:
	// a Hard requirement naming it is served there (see the pin rule).
	Draining bool
	// Role is the worker's part in a disaggregated fleet (pd.go): which
	// legs it is a candidate for.
	Role Role
}

// LoadReport is a worker's own view of its load, used to correct the
// router's predicted load when they drift apart.
type LoadReport struct {
	Key             workerref.Target
	ActiveRequests  int
	WaitingRequests int
	KVUsedBlocks    int
	KVTotalBlocks   int // 0 = unchanged
	PrefillTokens   int
	At              time.Time // zero = now
}

// BookingKind is the change a BookingEvent reports.
type BookingKind uint8

const (
	BookingAdd         BookingKind = iota + 1 // load booked on a worker
	BookingPrefillDone                        // the request's prefill finished: its prefill tokens leave
	BookingFree                               // the request ended (or was rolled back / expired)
)

var bookingKindNames = [...]string{"", "add", "prefill_done", "free"}

// String returns add, prefill_done or free.
func (k BookingKind) String() string {
	if int(k) > 0 && int(k) < len(bookingKindNames) {
		return bookingKindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// MarshalText encodes the kind by name, so the JSON form is readable.
func (k BookingKind) MarshalText() ([]byte, error) {
	if int(k) > 0 && int(k) < len(bookingKindNames) {
		return []byte(bookingKindNames[k]), nil
	}
	return nil, fmt.Errorf("%w: booking kind %d", ErrInvalidEvent, k)
}

// UnmarshalText decodes a kind name.
func (k *BookingKind) UnmarshalText(b []byte) error {
	for i := 1; i < len(bookingKindNames); i++ {
		if string(b) == bookingKindNames[i] {
			*k = BookingKind(i)
			return nil
		}
	}
	return fmt.Errorf("%w: booking kind %q", ErrInvalidEvent, b)
}

// BookingEvent is one change to one replica's bookings. The scheduler emits
// them through OnBookingChange and folds other replicas' in via ApplyRemote;
// moving them between replicas is the host's job (see
// docs/protocol.md for the wire form).
type BookingEvent struct {
	Replica       string      `json:"replica"`
	Seq           uint64      `json:"seq"` // per-replica, increasing; informational
	Kind          BookingKind `json:"kind"`
	RequestID     string      `json:"request_id"`
	Worker        string      `json:"worker"`
	Rank          uint32      `json:"rank"`
	Attempt       uint64      `json:"attempt"`
	PrefillTokens int         `json:"prefill_tokens,omitempty"` // add: uncached prompt tokens booked
	Blocks        int         `json:"blocks,omitempty"`         // add: decode blocks booked
	At            time.Time   `json:"at"`
}

// Errors. Every error returned by the package wraps one of these; test with
// errors.Is. Which API error code and HTTP status each becomes is decided at
// the edge, in the one mapping table of router/host (maperr.go).
var (
	ErrNoEligibleWorker = errors.New("scheduler: no eligible worker")                    // 503
	ErrNoCandidate      = errors.New("scheduler: policy left no candidate")              // 503
	ErrOverloaded       = errors.New("scheduler: overloaded, queue limit reached")       // 529
	ErrPinConflict      = errors.New("scheduler: pinned target disagrees with affinity") // 409
	ErrDeadline         = errors.New("scheduler: deadline passed while queued")          // 504
	ErrWouldQueue       = errors.New("scheduler: every usable worker is busy")           // Request.NoWait: never an API answer
	ErrDuplicateRequest = errors.New("scheduler: request id already booked or queued")   // 409
	ErrStaleFence       = errors.New("scheduler: stale fence")                           // 409
	ErrUnknownBooking   = errors.New("scheduler: unknown booking")                       // 404
	ErrUnknownRequest   = errors.New("scheduler: unknown request")                       // 404
	ErrCanceled         = errors.New("scheduler: request canceled")                      // 499-ish; 503 at the edge
	ErrInvalidRequest   = errors.New("scheduler: invalid request")                       // 400
	ErrInvalidWorker    = errors.New("scheduler: invalid worker")
	ErrInvalidEvent     = errors.New("scheduler: invalid booking event")
	ErrInvalidConfig    = errors.New("scheduler: invalid config")
	ErrPolicy           = errors.New("scheduler: policy returned an invalid choice") // 500
	ErrUnknownPolicy    = errors.New("scheduler: unknown policy")
	ErrNotStarted       = errors.New("scheduler: not started")
	ErrClosed           = errors.New("scheduler: closed")
)
