package replay

import (
	"context"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// Path names one way requests reach the fleet.
const (
	// PathNATS: the driver calls the NATS route API, sends the request to
	// the chosen worker's NATS endpoint and reports prefill_done and free
	// itself; latencies are the engine's model time plus the router queue
	// wait (see the package comment).
	PathNATS = "nats"
	// PathGateway: the production path. An OpenAI client per request posts
	// a streaming /v1/completions to the gateway, which routes over NATS,
	// forwards to the engine's vLLM HTTP face and books; the engines' KV
	// events reach the routers through ZMQ and one bridge per engine.
	// Latencies are what the client measures (wall clock x the speed-up),
	// so the real path's own cost is in them.
	PathGateway = "gateway"
)

// PathConfig is one path a run replays over.
type PathConfig struct {
	Name     string // PathNATS or PathGateway (the report's path field)
	NewStack StackFactory
	// NoTrueCache: the path cannot carry the true-cache policy's choice (the
	// gateway has no preference header); it is skipped there, with a note.
	NoTrueCache bool
}

// Frontend is an OpenAI-compatible endpoint that routes, serves and books
// in one call: the gateway path's client side.
type Frontend interface {
	Complete(ctx context.Context, req *FrontendRequest) (*FrontendReply, error)
}

// FrontendStack is a Stack whose requests go through a Frontend; its
// Router and Generator are not used.
type FrontendStack interface {
	Stack
	Frontend() Frontend
}

// FrontendRequest is one completion: the prompt as token ids.
type FrontendRequest struct {
	ID     string
	Model  string
	Tokens []uint32
	// MaxTokens is the client's max_tokens, what the gateway and routers see.
	MaxTokens int
	// OutputTokens is the reply's true length, sent only to the simulated
	// engine (its sim_output_tokens extension: the model ends its reply
	// there); the gateway passes the body through without reading it.
	OutputTokens int
	SessionID    string // empty = no session header
	SessionMode  SessionMode
}

// FrontendReply is what the client saw. Rejected marks the refusals a
// loaded router is expected to make (429, 503, 529).
type FrontendReply struct {
	Worker        string // the worker name the gateway reported
	OverlapBlocks int    // the router's predicted overlap on it
	PromptTokens  int
	CachedTokens  int // usage.prompt_tokens_details.cached_tokens
	OutputTokens  int
	TTFT, E2E     time.Duration // wall clock at the client
	// Route and QueueWait are the gateway's routing time and the router
	// queue's part of it (its Server-Timing header; 0 without it), wall
	// clock.
	Route, QueueWait time.Duration
}

// oneFrontend is one request's life over a Frontend. Latencies are the
// client's wall clock multiplied by the speed-up (workload time), so the
// transport, the gateway and the bridges' lag are part of them.
func (d *driver) oneFrontend(ctx context.Context, p *prepared) {
	cfg := d.cfg
	r := p.req
	rec := metrics.Record{ID: r.ID, Session: r.Session, Arrival: r.Arrival, PromptTokens: r.InputLength, PromptBlocks: p.promptBlocks}
	req := FrontendRequest{ID: r.ID, Model: cfg.Model, Tokens: r.Tokens, MaxTokens: p.maxTokens, OutputTokens: p.outputTokens}
	if len(r.BlockIDs) > 0 {
		req.Tokens = sim.ExpandBlockIDs(nil, r.BlockIDs, cfg.Workload.BlockTokens, r.InputLength)
	}
	if d.sessions != SessionNone && r.Session != "" {
		req.SessionID, req.SessionMode = r.Session, d.sessions
	}
	t0 := time.Now()
	reply, err := d.front.Complete(ctx, &req)
	rec.Route = time.Since(t0) // a failure's whole call
	if err != nil {
		rec.Outcome, rec.Code = classify(err)
		d.logFailure(ctx, &rec, req.ID, err)
		d.finish(rec)
		return
	}
	scale := func(x time.Duration) time.Duration { return time.Duration(float64(x) * cfg.Speedup) }
	rec.Worker = reply.Worker
	rec.RouterBlocks = reply.OverlapBlocks
	rec.CachedBlocks = reply.CachedTokens / cfg.BlockSize
	rec.OutputTokens = reply.OutputTokens
	rec.TTFT, rec.E2E = scale(reply.TTFT), scale(reply.E2E)
	if reply.OutputTokens > 1 {
		rec.ITL = (rec.E2E - rec.TTFT) / time.Duration(reply.OutputTokens-1)
	}
	// The routing decision as the gateway timed it: the client's wall clock
	// holds the whole request.
	rec.Route, rec.QueueWait = reply.Route, reply.QueueWait
	rec.Finish = r.Arrival + rec.E2E
	d.finish(rec)
}
