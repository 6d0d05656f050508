package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bench/stack"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workers"
)

// The real path of the demo (--path real): what production runs, in one
// process. Simulated engines with vLLM's HTTP API and vLLM KV events over
// ZMQ on loopback, one bridge per engine, two router replicas on an
// embedded NATS server, one gateway over NATS, and a workload of multi-turn
// chat sessions sent with the OpenAI chat JSON over net/http (the openai-go
// client stays out of the binary: it is large, and the demo needs one
// request shape and the SSE framing). Everything the table shows is measured
// at the client: cached_tokens in usage, TTFT, the worker header.

const (
	realModel = "demo"
	realBlock = 16 // engines' and routers' block size (the simulator tokenizes one byte per token)
)

// realDemoConfig is the validated command line of the real path.
type realDemoConfig struct {
	engines, replicas, kvBlocks int
	sessions, turns             int
	speedup                     float64 // the engines' model clock
	seed                        uint64
	sessionMode                 replay.SessionMode // kvrouter's session bindings
	baseSessions                bool
	log                         *slog.Logger
	// tracer receives the replicas' and the gateway's spans (nil: none).
	tracer trace.TracerProvider
}

// realPolicy is one side of the comparison.
type realPolicy struct {
	name, scheduler string
	sessions        replay.SessionMode // what X-Session-Id and X-Session-Mode the client sends
}

func runRealDemo(ctx context.Context, cfg realDemoConfig, stdout, stderr io.Writer) error {
	// As on the nats path: round-robin runs without affinity, as deployed
	// elsewhere, unless --baseline-sessions.
	base := replay.SessionNone
	if cfg.baseSessions {
		base = cfg.sessionMode
	}
	pols := []realPolicy{{"kvrouter", host.DefaultPolicy, cfg.sessionMode}, {"round-robin", "round-robin", base}}
	wl := newChatWorkload(cfg)
	fmt.Fprintf(stdout, "kvrouter demo (real path): %d chat sessions of %d turns over %d system prompts of %d tokens\n"+
		"  %d simulated vLLM engines (%d KV blocks of %d tokens, events over ZMQ), one bridge each, %d router replicas,\n"+
		"  embedded NATS, one gateway; an OpenAI-compatible client streams every turn\n  policies: kvrouter, round-robin\n\n",
		cfg.sessions, cfg.turns, len(wl.system), len(wl.system[0]), cfg.engines, cfg.kvBlocks, realBlock, cfg.replicas)
	began := time.Now()
	var sums []metrics.Summary
	for _, p := range pols {
		fmt.Fprintf(stderr, "  %s: starting the stack\n", p.name)
		st, workerRefs, err := startRealStack(ctx, cfg, p.scheduler)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		t0 := time.Now()
		recs, err := wl.run(ctx, st.GatewayURL, p.sessions)
		wall := time.Since(t0)
		if cerr := st.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s: stopping the stack: %w", p.name, cerr)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		s := metrics.Summarize(recs, metrics.Options{Policy: p.name, BlockSize: realBlock, Workers: workerRefs, Wall: wall})
		s.Policy = fmt.Sprintf("%s (sessions: %s)", p.name, p.sessions)
		fmt.Fprintf(stderr, "  %s: %d/%d requests in %.1f s\n", p.name, s.Done, s.Requests, wall.Seconds())
		sums = append(sums, s)
	}
	fmt.Fprintln(stdout)
	printDemoTable(stdout, sums)
	fmt.Fprintf(stdout, "\nhit ratio = cached_tokens / prompt_tokens in the engines' usage; TTFT = the client's wait for the first\n"+
		"content chunk through gateway, router and engine (the engines' model clock at %gx); routing decision = the\n"+
		"gateway's route call (its Server-Timing header: queue, choice, booking and, with a session, its binding). Took %.0f s.\n", cfg.speedup,
		time.Since(began).Seconds())
	return nil
}

func demoRegistry(log *slog.Logger) workers.RegistryConfig {
	// Short TTLs: the stack starts and stops in seconds.
	return workers.RegistryConfig{TTL: time.Second, Heartbeat: 300 * time.Millisecond, MarkerTTL: time.Second, Logger: log}
}

// startRealStack starts one fresh deployment of the real path for one
// policy (bench/stack.Real, which `bench replay --path gateway` runs too).
func startRealStack(ctx context.Context, cfg realDemoConfig, policy string) (*stack.Real, []string, error) {
	var hcs []host.Config
	for i := range cfg.replicas {
		hcs = append(hcs, host.Config{ReplicaID: fmt.Sprintf("demo-r%d", i), Models: []string{realModel},
			Registry: demoRegistry(cfg.log), Policy: scheduler.PolicyConfig{Name: policy}, Logger: cfg.log,
			Telemetry: host.Telemetry{TracerProvider: cfg.tracer}})
	}
	st, err := stack.StartReal(ctx, stack.RealConfig{Model: realModel, Engines: cfg.engines, KVBlocks: cfg.kvBlocks,
		BlockSize: realBlock, Speedup: cfg.speedup, Replicas: hcs, Registry: demoRegistry(cfg.log), Logger: cfg.log,
		Gateway: gateway.Telemetry{TracerProvider: cfg.tracer}})
	if err != nil {
		return nil, nil, err
	}
	refs := make([]string, len(st.Workers))
	for i, w := range st.Workers {
		refs[i] = w + "#0"
	}
	return st, refs, nil
}

// chatWorkload is the real path's client: sessions share a few long system
// prompts, and every turn resends the whole conversation, as chat clients
// do, so a turn's prompt extends the previous one.
type chatWorkload struct {
	system    []string
	sessions  int
	turns     int
	stagger   time.Duration // between session starts
	think     time.Duration // between a reply and the next turn
	maxTokens int
	seed      uint64
	client    *http.Client
}

func newChatWorkload(cfg realDemoConfig) *chatWorkload {
	rng := rand.New(rand.NewPCG(cfg.seed, 1))
	w := &chatWorkload{sessions: cfg.sessions, turns: cfg.turns, stagger: 120 * time.Millisecond, think: 300 * time.Millisecond,
		maxTokens: 24, seed: cfg.seed, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 60 * time.Second}}
	for i := range max(1, cfg.sessions/4) {
		w.system = append(w.system, fmt.Sprintf("You are assistant %d. ", i)+words(rng, 2048))
	}
	for i := range w.system {
		w.system[i] = w.system[i][:2048]
	}
	return w
}

// words is n bytes of lower-case pseudo-words.
func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		for range 2 + rng.IntN(7) {
			b.WriteByte(byte('a' + rng.IntN(26)))
		}
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// run sends every session's turns through the gateway at base and returns
// one record per request.
func (w *chatWorkload) run(ctx context.Context, base string, sessions replay.SessionMode) ([]metrics.Record, error) {
	defer w.client.CloseIdleConnections()
	rec := metrics.NewRecorder(w.sessions * w.turns)
	start := time.Now()
	var wg sync.WaitGroup
	for s := range w.sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(s) * w.stagger):
			}
			rng := rand.New(rand.NewPCG(w.seed, uint64(s)+100))
			id := "session-" + strconv.Itoa(s)
			msgs := []chatMsg{{"system", w.system[s%len(w.system)]}}
			for t := range w.turns {
				msgs = append(msgs, chatMsg{"user", words(rng, 200)})
				r, reply := w.turn(ctx, base, id, sessions, msgs, start)
				r.ID, r.Session = fmt.Sprintf("%s/%d", id, t), id
				rec.Add(r)
				if r.Outcome != metrics.Done {
					// The rest of the conversation cannot be sent: count
					// it as failed, so that "requests done" shows the loss.
					for rest := t + 1; rest < w.turns; rest++ {
						rec.Add(metrics.Record{ID: fmt.Sprintf("%s/%d", id, rest), Session: id, Outcome: metrics.Failed, Code: "session aborted"})
					}
					return
				}
				msgs = append(msgs, chatMsg{"assistant", reply})
				select {
				case <-ctx.Done():
					return
				case <-time.After(w.think):
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return rec.Records(), nil
}

// turn streams one chat completion and measures it.
func (w *chatWorkload) turn(ctx context.Context, base, session string, mode replay.SessionMode, msgs []chatMsg, start time.Time) (metrics.Record, string) {
	r := metrics.Record{Outcome: metrics.Failed}
	body, _ := json.Marshal(map[string]any{"model": realModel, "messages": msgs, "max_tokens": w.maxTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		r.Code = err.Error()
		return r, ""
	}
	req.Header.Set("Content-Type", "application/json")
	if mode != replay.SessionNone {
		req.Header.Set(gateway.DefaultSessionHeader, session)
	}
	if mode == replay.SessionSoft {
		req.Header.Set(gateway.ModeHeader, "soft")
	}
	sent := time.Now()
	r.Arrival = sent.Sub(start)
	resp, err := w.client.Do(req)
	if err != nil {
		r.Code = "transport"
		return r, ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.Code = strconv.Itoa(resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			r.Outcome = metrics.Rejected
		}
		return r, ""
	}
	r.Worker = resp.Header.Get(gateway.HeaderWorker)
	r.RouterBlocks, _ = strconv.Atoi(resp.Header.Get(gateway.HeaderOverlapBlocks))
	// The routing decision as the gateway timed it (its Server-Timing).
	r.Route, r.QueueWait, _ = gateway.ParseServerTiming(resp.Header.Values(gateway.HeaderServerTiming))
	var reply strings.Builder
	usage, err := stack.ReadStream(resp.Body, func(text string) {
		if text != "" && r.TTFT == 0 {
			r.TTFT = time.Since(sent)
		}
		reply.WriteString(text)
	})
	switch {
	case errors.Is(err, stack.ErrBadChunk):
		r.Code = "bad chunk"
		return r, ""
	case err != nil:
		r.Code = "stream cut"
		return r, ""
	}
	r.E2E = time.Since(sent)
	r.Finish = r.Arrival + r.E2E
	r.PromptTokens, r.OutputTokens = usage.PromptTokens, usage.CompletionTokens
	r.PromptBlocks, r.CachedBlocks = usage.PromptTokens/realBlock, usage.PromptTokensDetails.CachedTokens/realBlock
	if r.OutputTokens > 1 {
		r.ITL = (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1)
	}
	r.Outcome = metrics.Done
	return r, reply.String()
}
