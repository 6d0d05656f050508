package chaos

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Kind is what a request asked.
type Kind uint8

const (
	// Route is a route request (POST /v1/route, or kvr.route.<model>).
	Route Kind = iota
	// Read is a session read (GET /v1/sessions/{id}, or the NATS session
	// get): it reports the binding and changes nothing.
	Read
)

func (k Kind) String() string {
	if k == Read {
		return "read"
	}
	return "route"
}

// Session modes as the route API spells them.
const (
	Hard = "hard"
	Soft = "soft"
)

// Op is one request as its client saw it: when it was sent and answered
// (since the recorder's start) and what the answer said.
type Op struct {
	Client  int    // zero-based client id
	Session string // session id
	Mode    string // Hard or Soft: the session_mode the client sends
	Kind    Kind
	Via     string // "http" or "nats"
	// Restricted is set when the request named allowed_workers (a Hard
	// session may then be refused with binding_rejected).
	Restricted bool

	Invoke, Return time.Duration
	// Deadline is the deadline_ms the request carried (0 for reads).
	Deadline time.Duration
	// Released is, for a NATS request in the partition test, the latest
	// heal of a cut while it was out (0: none). A cut link may have held
	// the request (or its reply) until then, so its lateness is measured
	// from the later of Invoke and Released.
	Released time.Duration

	// On success (Code == "" and !Failed()):
	Worker  string // where the route sends the request; the bound worker of a read
	Replica string // the replica that answered
	Outcome string // binding outcome (api.Outcome*) of a route
	Bound   string // the binding's worker (for kept_other it differs from Worker)
	Version uint64 // the binding's version

	// On an API error: its code and status; for binding_rejected, the
	// worker the message names as bound ("" if it names none).
	Code        string
	Status      int
	Message     string
	RejectedFor string

	// Transport is the client-side failure when no API answer came (a
	// timeout, a dropped connection, no responders).
	Transport string
	// Excused is set when the client's own connection to NATS dropped while
	// the request was out: an unanswered request is then the client's loss,
	// not the router's.
	Excused bool
}

// OK reports a successful reply.
func (o *Op) OK() bool { return o.Code == "" && o.Transport == "" }

// Absent reports a read answered "no binding" (404).
func (o *Op) Absent() bool { return o.Kind == Read && o.Code == "not_found" }

// Failed reports a request whose effect is unknown: no answer, or an error
// other than a read's 404 or a Hard binding_rejected (both of which name
// the state they saw).
func (o *Op) Failed() bool {
	return !o.OK() && !o.Absent() && o.Code != "binding_rejected"
}

// Took is the request's latency as the client measured it.
func (o *Op) Took() time.Duration { return o.Return - o.Invoke }

// Recorder collects Ops from concurrent clients. Times are measured on the
// monotonic clock from the recorder's creation.
type Recorder struct {
	t0 time.Time
	mu sync.Mutex
	op []Op
}

// NewRecorder starts the clock.
func NewRecorder() *Recorder { return &Recorder{t0: time.Now()} }

// Now is the time since the recorder started.
func (r *Recorder) Now() time.Duration { return time.Since(r.t0) }

// At converts a wall time into the recorder's clock.
func (r *Recorder) At(t time.Time) time.Duration { return t.Sub(r.t0) }

// Add records one finished request.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	r.op = append(r.op, op)
	r.mu.Unlock()
}

// Ops returns a copy of the history, ordered by invoke time.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	out := append([]Op(nil), r.op...)
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Op) int { return cmp.Compare(a.Invoke, b.Invoke) })
	return out
}

// bySession groups ops by session, keeping their order.
func bySession(ops []Op, keep func(*Op) bool) map[string][]Op {
	out := map[string][]Op{}
	for i := range ops {
		if keep(&ops[i]) {
			out[ops[i].Session] = append(out[ops[i].Session], ops[i])
		}
	}
	return out
}
