package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workerref"
)

// GatewayFactory returns a replay.StackFactory for the gateway path
// (replay.PathGateway): a fresh Real deployment per policy, its replicas
// configured as the NATS path's are, driven through the gateway.
func GatewayFactory(opt Options) replay.StackFactory {
	return func(ctx context.Context, cfg replay.StackConfig) (replay.Stack, error) {
		return NewGateway(ctx, cfg, opt)
	}
}

// GatewayStack is the real path as a replay.FrontendStack.
type GatewayStack struct {
	real   *Real
	model  string
	client *http.Client
	front  *frontend
}

var _ replay.FrontendStack = (*GatewayStack)(nil)

// NewGateway starts the real path for one policy.
func NewGateway(ctx context.Context, cfg replay.StackConfig, opt Options) (*GatewayStack, error) {
	if cfg.Probe {
		return nil, fmt.Errorf("%w: the gateway path has no cache probe (true-cache runs over the nats path)", replay.ErrConfig)
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	opt.Prefix = api.DefaultPrefix // the bridges and the gateway use the default prefix
	s := &Stack{cfg: cfg, opt: opt}
	var hcs []host.Config
	for i := range cfg.Replicas {
		hc := s.replicaConfig(i)
		hc.BlockSize = cfg.BlockSize
		hcs = append(hcs, hc)
	}
	r, err := StartReal(ctx, RealConfig{
		Model: cfg.Model, Engines: cfg.Workers, KVBlocks: cfg.KVBlocks, BlockSize: cfg.BlockSize,
		MaxBatchedTokens: cfg.MaxBatchedTokens, MaxSeqs: cfg.MaxSeqs, Speedup: cfg.Speedup,
		MaxModelLen: 1 << 20, IDPrefix: "w", Replicas: hcs, Registry: registryConfig(opt.Logger),
		// Load reports every second of model time, as on the NATS path.
		MetricsInterval: loadInterval(cfg.Speedup), Logger: opt.Logger,
	})
	if err != nil {
		return nil, err
	}
	g := &GatewayStack{real: r, model: cfg.Model, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0}}}
	g.front = &frontend{base: r.GatewayURL, client: g.client}
	return g, nil
}

// Frontend implements replay.FrontendStack.
func (g *GatewayStack) Frontend() replay.Frontend { return g.front }

// Router is nil: requests go through the Frontend.
func (g *GatewayStack) Router() replay.Router { return nil }

// Generator is nil: requests go through the Frontend.
func (g *GatewayStack) Generator() replay.Generator { return nil }

// Workers lists the engines' worker ids.
func (g *GatewayStack) Workers() []string { return g.real.Workers }

// Probe is nil: the engines' caches are read only through their events.
func (g *GatewayStack) Probe() replay.CacheProbe { return nil }

// Loads is nil.
func (g *GatewayStack) Loads() replay.LoadProbe { return nil }

// CachedShares implements replay.ShareProber.
func (g *GatewayStack) CachedShares() []float64 {
	return cachedShares(g.real.replicas, g.model)
}

// Real is the running deployment.
func (g *GatewayStack) Real() *Real { return g.real }

// Close stops the client and the deployment.
func (g *GatewayStack) Close(context.Context) error {
	g.client.CloseIdleConnections()
	return g.real.Close()
}

// frontend is the OpenAI client side: one streaming POST /v1/completions
// per request, in the OpenAI wire format (prompt as token ids,
// stream_options.include_usage), read chunk by chunk as an OpenAI SDK
// does; the worker and overlap come from the gateway's X-Kvr headers.
type frontend struct {
	base   string
	client *http.Client
}

func (f *frontend) Complete(ctx context.Context, req *replay.FrontendRequest) (*replay.FrontendReply, error) {
	fields := map[string]any{
		"model": req.Model, "prompt": req.Tokens, "max_tokens": req.MaxTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "user": req.ID,
	}
	if req.OutputTokens > 0 {
		// The simulated model's reply length: read by the engine only
		// (docs/simulator.md), never by the gateway or the routers.
		fields["sim_output_tokens"] = req.OutputTokens
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("stack: encode %s: %w", req.ID, err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, f.base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if req.SessionID != "" {
		hr.Header.Set(gateway.DefaultSessionHeader, req.SessionID)
		hr.Header.Set(gateway.ModeHeader, string(req.SessionMode))
	}
	sent := time.Now()
	resp, err := f.client.Do(hr)
	if err != nil {
		return nil, &replay.RouteError{Code: "transport", Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code    any    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		s := resp.StatusCode
		code := "http_" + strconv.Itoa(s)
		if c, ok := e.Error.Code.(string); ok && c != "" {
			code += "_" + c
		}
		return nil, &replay.RouteError{Code: code, Rejected: s == 409 || s == 429 || s == 503 || s == api.StatusOverloaded,
			Err: fmt.Errorf("%s: %s", resp.Status, e.Error.Message)}
	}
	out := &replay.FrontendReply{}
	if w := resp.Header.Get(gateway.HeaderWorker); w != "" {
		out.Worker = w
		if t, err := workerref.Parse(w); err == nil {
			out.Worker = t.Worker
		}
	}
	out.OverlapBlocks, _ = strconv.Atoi(resp.Header.Get(gateway.HeaderOverlapBlocks))
	out.Route, out.QueueWait, _ = gateway.ParseServerTiming(resp.Header.Values(gateway.HeaderServerTiming))
	usage, err := ReadStream(resp.Body, func(string) {
		if out.TTFT == 0 {
			out.TTFT = time.Since(sent)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("stack: %s: %w", req.ID, err)
	}
	out.E2E = time.Since(sent)
	out.PromptTokens, out.OutputTokens, out.CachedTokens = usage.PromptTokens, usage.CompletionTokens, usage.PromptTokensDetails.CachedTokens
	return out, nil
}
