package workload

import (
	"fmt"
	"time"
)

// MooncakeBlockTokens is the number of tokens one Mooncake hash id stands for.
const MooncakeBlockTokens = 512

// Request is one request of a workload. A prompt is given either as token ids
// (synthetic workloads) or as Mooncake-style block ids, each standing for
// BlockTokens tokens of its Workload and for the whole prefix up to it.
type Request struct {
	ID      string        // unique within the workload
	Arrival time.Duration // offset from the workload's start, non-decreasing
	Session string        // empty when the request belongs to no session
	Group   string        // optional tag: shared-prompt group, fan-out burst, trace root

	Tokens   []uint32 // prompt token ids; may share a backing array with other requests: read only
	BlockIDs []uint64 // prompt block ids (Mooncake hash ids); read only

	InputLength  int // prompt tokens
	OutputLength int // tokens to generate
}

// Workload is an ordered list of requests plus what is needed to interpret
// their prompts.
type Workload struct {
	Name        string // e.g. "mooncake:conversation", "synthetic:shared-prefix"
	BlockTokens int    // tokens per BlockIDs entry; 0 when requests carry Tokens
	// MaxTokens is the max_tokens a client sends with every request: what
	// routers may know of the reply's length (0 = DefaultMaxTokens). A
	// request's OutputLength is what the model then generates, at most this.
	MaxTokens int
	Requests  []Request
}

// DefaultMaxTokens is the client's max_tokens of a workload that sets none.
const DefaultMaxTokens = 1024

// TraceMaxTokens is the max_tokens of the Mooncake traces' clients: a fixed
// budget above every output of both traces (the longest is 2,000 tokens).
const TraceMaxTokens = 2048

// ClientMaxTokens is the max_tokens sent with every request of w.
func (w *Workload) ClientMaxTokens() int {
	if w.MaxTokens > 0 {
		return w.MaxTokens
	}
	return DefaultMaxTokens
}

// Span is the arrival time of the last request.
func (w *Workload) Span() time.Duration {
	if len(w.Requests) == 0 {
		return 0
	}
	return w.Requests[len(w.Requests)-1].Arrival
}

// Sessions counts the distinct non-empty session ids.
func (w *Workload) Sessions() int {
	seen := make(map[string]struct{})
	for i := range w.Requests {
		if s := w.Requests[i].Session; s != "" {
			seen[s] = struct{}{}
		}
	}
	return len(seen)
}

// Stats sums a workload's shape for reports.
type Stats struct {
	Requests      int           `json:"requests"`
	Sessions      int           `json:"sessions"`
	InputTokens   int64         `json:"input_tokens"`
	OutputTokens  int64         `json:"output_tokens"`
	Span          time.Duration `json:"-"`
	SpanSeconds   float64       `json:"span_s"`
	MeanInput     float64       `json:"mean_input_tokens"`
	MeanOutput    float64       `json:"mean_output_tokens"`
	RatePerSecond float64       `json:"requests_per_s"`
}

// Stats returns the workload's totals.
func (w *Workload) Stats() Stats {
	s := Stats{Requests: len(w.Requests), Sessions: w.Sessions(), Span: w.Span()}
	for i := range w.Requests {
		s.InputTokens += int64(w.Requests[i].InputLength)
		s.OutputTokens += int64(w.Requests[i].OutputLength)
	}
	s.SpanSeconds = s.Span.Seconds()
	if s.Requests > 0 {
		s.MeanInput = float64(s.InputTokens) / float64(s.Requests)
		s.MeanOutput = float64(s.OutputTokens) / float64(s.Requests)
	}
	if s.SpanSeconds > 0 {
		s.RatePerSecond = float64(s.Requests) / s.SpanSeconds
	}
	return s
}

// Validate checks the invariants every consumer relies on: unique ids,
// non-decreasing arrivals, a prompt in exactly one form that matches its
// length, and positive lengths.
func (w *Workload) Validate() error {
	ids := make(map[string]struct{}, len(w.Requests))
	var last time.Duration
	for i := range w.Requests {
		r := &w.Requests[i]
		if r.ID == "" {
			return fmt.Errorf("%w: request %d: empty id", ErrInvalid, i)
		}
		if _, dup := ids[r.ID]; dup {
			return fmt.Errorf("%w: request %d: duplicate id %q", ErrInvalid, i, r.ID)
		}
		ids[r.ID] = struct{}{}
		if r.Arrival < last {
			return fmt.Errorf("%w: request %q: arrival %v before previous %v", ErrInvalid, r.ID, r.Arrival, last)
		}
		last = r.Arrival
		if r.InputLength <= 0 {
			return fmt.Errorf("%w: request %q: input_length %d", ErrInvalid, r.ID, r.InputLength)
		}
		if r.OutputLength < 0 {
			return fmt.Errorf("%w: request %q: output_length %d", ErrInvalid, r.ID, r.OutputLength)
		}
		switch {
		case len(r.Tokens) > 0 && len(r.BlockIDs) > 0:
			return fmt.Errorf("%w: request %q: both tokens and block ids", ErrInvalid, r.ID)
		case len(r.Tokens) > 0:
			if len(r.Tokens) != r.InputLength {
				return fmt.Errorf("%w: request %q: %d tokens but input_length %d", ErrInvalid, r.ID, len(r.Tokens), r.InputLength)
			}
		case len(r.BlockIDs) > 0:
			if w.BlockTokens <= 0 {
				return fmt.Errorf("%w: request %q: block ids but workload block size %d", ErrInvalid, r.ID, w.BlockTokens)
			}
			if want := ceilDiv(r.InputLength, w.BlockTokens); len(r.BlockIDs) != want {
				return fmt.Errorf("%w: request %q: %d block ids, want ceil(%d/%d) = %d", ErrInvalid, r.ID, len(r.BlockIDs), r.InputLength, w.BlockTokens, want)
			}
		default:
			return fmt.Errorf("%w: request %q: no prompt", ErrInvalid, r.ID)
		}
	}
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
