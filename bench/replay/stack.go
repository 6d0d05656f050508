package replay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// RouteRequest is what the driver asks the route API (a subset of the
// host's RouteRequest: the prompt as block hashes, never tokens).
type RouteRequest struct {
	ID             string
	Model          string
	BlockHashes    []uint64 // sequence hashes of the full prompt blocks
	BlockSize      int
	InputTokens    int
	ExpectedOutput int
	SessionID      string // empty = no session
	RoutingKey     string // what prefix-hashing policies key on (chwbl); empty = the prompt's opening
	Pin            string // exact worker, empty = let the router choose
	Prefer         string // Soft preference: taken while the worker is a candidate
	PD             bool   // ask for a prefill/decode pair (docs/pd.md)
}

// Routed is the route API's answer. Handle is the adapter's own state for
// the lifecycle calls (the host's RouteResponse).
type Routed struct {
	Worker   string
	Endpoint string
	Overlap  int // blocks the router believed cached on Worker
	// QueueWait is how long the request waited in the router's queue (wall).
	QueueWait time.Duration
	Binding   string
	Handle    any
	// Prefill is the prefill leg of a split PD route (its worker, endpoint,
	// overlap and booking), nil when Worker serves the whole request.
	Prefill *Routed
}

// RouteError is a refusal by the route API. Rejected marks the refusals a
// loaded router is expected to make (overloaded, no eligible worker,
// binding conflicts); other errors count as failures.
type RouteError struct {
	Code     string
	Rejected bool
	Err      error
}

func (e *RouteError) Error() string { return "route: " + e.Code + ": " + e.Err.Error() }
func (e *RouteError) Unwrap() error { return e.Err }

// Router is the route API as a client sees it.
type Router interface {
	Route(ctx context.Context, req *RouteRequest) (*Routed, error)
	PrefillDone(ctx context.Context, r *Routed) error
	Free(ctx context.Context, r *Routed) error
}

// Generator sends a request to a worker endpoint and waits for its answer,
// calling onFirstToken once when the first output token arrives.
type Generator interface {
	Generate(ctx context.Context, endpoint string, req *sim.GenerateRequest, onFirstToken func()) (*sim.GenerateReply, error)
}

// CacheProbe reads the workers' true cache contents.
type CacheProbe interface {
	// CachedPrefix sets out[worker] to the number of leading hashes the
	// worker holds right now (workers holding none may be left out).
	CachedPrefix(hashes []kvevents.SeqHash, out map[string]int)
}

// LoadSample is one worker's load as a router replica predicts it (summed
// over its ranks), as read through a LoadProbe.
type LoadSample struct {
	PrefillTokens  int
	DecodeBlocks   int
	ActiveRequests int
}

// LoadProbe reads the router's own load view (the default cost's inputs).
type LoadProbe interface {
	Loads(ctx context.Context, out map[string]LoadSample) error
}

// Stack is one fleet with its routers, fresh for one policy.
type Stack interface {
	Router() Router
	Generator() Generator
	// Workers lists the worker ids of the fleet.
	Workers() []string
	// Probe is nil unless StackConfig.Probe was set.
	Probe() CacheProbe
	// Loads is the router's load view; nil when the stack has none (the
	// true-cache policy then uses its own bookkeeping).
	Loads() LoadProbe
	Close(ctx context.Context) error
}

// StackFactory builds a stack.
type StackFactory func(ctx context.Context, cfg StackConfig) (Stack, error)

// SessionMode says whether requests carry their session id and, if so, the
// mode of the bindings the routers create.
type SessionMode string

const (
	SessionNone SessionMode = "none" // session ids are not sent
	SessionHard SessionMode = "hard" // a session stays on its worker while it is alive
	SessionSoft SessionMode = "soft" // the bound worker is preferred, not required
)

// ParseSessionMode accepts none, hard or soft (any case).
func ParseSessionMode(s string) (SessionMode, error) {
	switch m := SessionMode(strings.ToLower(strings.TrimSpace(s))); m {
	case SessionNone, SessionHard, SessionSoft:
		return m, nil
	case "":
		return SessionNone, nil
	}
	return "", fmt.Errorf("%w: session mode %q (want none, hard or soft)", ErrConfig, s)
}

// StackConfig is what a stack is built from.
type StackConfig struct {
	Policy  Policy
	Model   string
	Workers int
	// Fleet splits the workers into prefill and decode roles (their sum is
	// Workers); zero = every worker both. Transfer is the decode engines'
	// KV transfer model.
	Fleet       Fleet
	Transfer    sim.TransferModel
	KVBlocks    int // per worker
	BlockSize   int
	Replicas    int
	Speedup     float64
	SessionMode SessionMode
	Seed        uint64
	// Probe asks for a CacheProbe (the true-cache policy needs one).
	Probe bool
	// MaxBatchedTokens and MaxSeqs of each simulated worker (0 = sim defaults).
	MaxBatchedTokens int
	MaxSeqs          int
	// RouteDeadline bounds a request's wait in a router queue (wall clock).
	RouteDeadline time.Duration
	// QueueThreshold is the routers' queue threshold: a worker is busy when
	// its booked prefill tokens reach this fraction of its max batched
	// tokens (or its decode blocks this fraction of its KV blocks), and a
	// request waits in the router when every worker is busy. 0 = the
	// scheduler's default (1.0); negative = no router-side queueing.
	QueueThreshold float64
}

// ShareProber is a Stack whose routers report their cached-share estimate
// (scheduler.Stats.CachedShare, one value per replica), which the default
// cost's decode-block weight follows below one half. The driver samples it
// during a run and reports the lowest value (metrics.Summary.CachedShareLow).
type ShareProber interface {
	CachedShares() []float64
}

// Diagnoser is a Stack that has something to say about the run when it
// ends (read before Close); the lines go into the report's notes.
type Diagnoser interface {
	Diagnostics() []string
}
