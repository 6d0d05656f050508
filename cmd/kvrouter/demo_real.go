package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/bridge"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
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
		st, err := startRealStack(ctx, cfg, p.scheduler)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		t0 := time.Now()
		recs, err := wl.run(ctx, st.gatewayURL, p.sessions)
		wall := time.Since(t0)
		if cerr := st.close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s: stopping the stack: %w", p.name, cerr)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		s := metrics.Summarize(recs, metrics.Options{Policy: p.name, BlockSize: realBlock, Workers: st.workerRefs, Wall: wall})
		s.Policy = fmt.Sprintf("%s (sessions: %s)", p.name, p.sessions)
		fmt.Fprintf(stderr, "  %s: %d/%d requests in %.1f s\n", p.name, s.Done, s.Requests, wall.Seconds())
		sums = append(sums, s)
	}
	fmt.Fprintln(stdout)
	printDemoTable(stdout, sums)
	fmt.Fprintf(stdout, "\nhit ratio = cached_tokens / prompt_tokens in the engines' usage; TTFT = the client's wait for the first\n"+
		"content chunk through gateway, router and engine (the engines' model clock at %gx). Took %.0f s.\n", cfg.speedup,
		time.Since(began).Seconds())
	return nil
}

// realStack is one fresh deployment for one policy.
type realStack struct {
	emb        *natsconn.Embedded
	conns      []*nats.Conn
	replicas   []*host.Replica
	engines    []*simEngine
	stopRun    context.CancelFunc
	ran        chan error
	bridges    []chan error
	stopBridge context.CancelFunc
	gw         *http.Server
	gwClient   *http.Client // the gateway's client to the engines
	gatewayURL string
	workerRefs []string
}

func demoRegistry(log *slog.Logger) workers.RegistryConfig {
	// Short TTLs: the stack starts and stops in seconds.
	return workers.RegistryConfig{TTL: time.Second, Heartbeat: 300 * time.Millisecond, MarkerTTL: time.Second, Logger: log}
}

func startRealStack(ctx context.Context, cfg realDemoConfig, policy string) (st *realStack, err error) {
	st = &realStack{ran: make(chan error, cfg.engines)}
	defer func() {
		if err != nil {
			_ = st.close()
			st = nil
		}
	}()
	if st.emb, err = natsconn.StartEmbedded(natsconn.Config{Embedded: true}, cfg.log); err != nil {
		return st, err
	}
	nc, _, err := st.connect()
	if err != nil {
		return st, err
	}
	for i := range cfg.replicas {
		rnc, _, err := st.connect()
		if err != nil {
			return st, err
		}
		r, err := host.New(rnc, host.Config{ReplicaID: fmt.Sprintf("demo-r%d", i), Models: []string{realModel},
			Registry: demoRegistry(cfg.log), Policy: scheduler.PolicyConfig{Name: policy}, Logger: cfg.log})
		if err != nil {
			return st, fmt.Errorf("replica %d: %w", i, err)
		}
		st.replicas = append(st.replicas, r)
		if err := r.Start(ctx); err != nil {
			return st, fmt.Errorf("replica %d start: %w", i, err)
		}
	}
	if err := st.startEngines(cfg); err != nil {
		return st, err
	}
	bctx, stop := context.WithCancel(context.Background())
	st.stopBridge = stop
	for i, se := range st.engines {
		if err := st.startBridge(bctx, cfg, i, se); err != nil {
			return st, err
		}
	}
	if err := st.waitReady(ctx, len(st.engines)); err != nil {
		return st, err
	}
	st.gwClient = &http.Client{Transport: &http.Transport{}}
	g, err := gateway.New(gateway.Config{Router: gateway.ClientRouter{C: api.NewClient(nc, "", nil)}, Models: []string{realModel},
		HTTPClient: st.gwClient, Logger: cfg.log})
	if err != nil {
		return st, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return st, err
	}
	st.gw = &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	go st.gw.Serve(ln)
	st.gatewayURL = "http://" + ln.Addr().String()
	return st, nil
}

// connect opens one more in-process connection to the embedded server.
func (st *realStack) connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect("", nats.InProcessServer(st.emb.Server), nats.Name("kvrouter-demo"))
	if err != nil {
		return nil, nil, fmt.Errorf("embedded nats: %w", err)
	}
	st.conns = append(st.conns, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	return nc, js, nil
}

// startEngines starts engines as `kvrouter sim serve` does, with vLLM KV
// events on ephemeral loopback ZMQ ports and HTTP on 127.0.0.1:0.
func (st *realStack) startEngines(cfg realDemoConfig) error {
	runCtx, stop := context.WithCancel(context.Background())
	st.stopRun = stop
	for i := range cfg.engines {
		se := &simEngine{}
		st.engines = append(st.engines, se)
		ec := vllmzmq.DefaultConfig()
		ec.EnableKVCacheEvents, ec.Topic = true, "kv"
		ec.Endpoint, ec.ReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
		var err error
		if se.events, err = sim.NewVLLMEvents(ec, 1, cfg.log); err != nil {
			return fmt.Errorf("engine %d: KV events: %w", i, err)
		}
		if se.eng, err = sim.New(sim.Config{Worker: fmt.Sprintf("engine-%d", i), Model: realModel, BlockSize: realBlock,
			KVBlocks: cfg.kvBlocks, Speedup: cfg.speedup, NewEmitter: se.events.Factory()}); err != nil {
			return fmt.Errorf("engine %d: %w", i, err)
		}
		face, err := vllmapi.New(vllmapi.Config{Engine: se.eng, Model: realModel, MaxModelLen: 32768, Logger: cfg.log})
		if err != nil {
			return fmt.Errorf("engine %d: %w", i, err)
		}
		if se.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return fmt.Errorf("engine %d: %w", i, err)
		}
		se.http = &http.Server{Handler: face, ReadHeaderTimeout: 10 * time.Second}
		go func() { st.ran <- se.eng.Run(runCtx) }()
		go se.http.Serve(se.ln)
	}
	return nil
}

func (st *realStack) startBridge(ctx context.Context, cfg realDemoConfig, i int, se *simEngine) error {
	nc, js, err := st.connect()
	if err != nil {
		return err
	}
	p := se.events.Publisher(0)
	id := fmt.Sprintf("engine-%d", i)
	b, err := bridge.New(bridge.Config{EngineURL: "http://" + se.ln.Addr().String(), KVEvents: p.Endpoint(),
		KVReplay: p.ReplayEndpoint(), Topic: "kv", Model: realModel, WorkerID: id, RouterBlockSize: host.DefaultBlockSize,
		MetricsInterval: 100 * time.Millisecond, HealthInterval: 200 * time.Millisecond,
		Events: kvevents.PublisherConfig{MaxDelay: time.Millisecond}, Registry: demoRegistry(cfg.log),
		DrainWait: 2 * time.Second, Logger: cfg.log.With("bridge", id)}, nc, js)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", id, err)
	}
	done := make(chan error, 1)
	st.bridges = append(st.bridges, done)
	st.workerRefs = append(st.workerRefs, id+"#0")
	go func() { done <- b.Run(ctx) }()
	return nil
}

// waitReady waits until every replica lists n ready workers with a load
// report from their bridges.
func (st *realStack) waitReady(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ready := 0
		for _, r := range st.replicas {
			if w, err := r.Workers(realModel); err == nil && len(w.Workers) == n {
				ok := true
				for _, ws := range w.Workers {
					ok = ok && ws.State == "ready" && ws.Reported != nil
				}
				if ok {
					ready++
				}
			}
		}
		if ready == len(st.replicas) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d replicas to list %d ready bridged engines (%d do): %w", len(st.replicas), n, ready, ctx.Err())
		case <-tick.C:
		}
	}
}

// close stops the stack from the client side inwards: gateway, bridges,
// engines, replicas, NATS.
func (st *realStack) close() error {
	var errs []error
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if st.gw != nil {
		if st.gw.Shutdown(sctx) != nil {
			st.gw.Close()
		}
		st.gwClient.CloseIdleConnections()
	}
	if st.stopBridge != nil {
		st.stopBridge()
	}
	for i, done := range st.bridges {
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, fmt.Errorf("bridge engine-%d: %w", i, err))
			}
		case <-sctx.Done():
			errs = append(errs, fmt.Errorf("bridge engine-%d did not stop", i))
		}
	}
	for _, se := range st.engines {
		if se.http != nil && se.http.Shutdown(sctx) != nil {
			se.http.Close()
		}
	}
	running := 0
	for _, se := range st.engines {
		if se.eng != nil {
			running++
		}
	}
	errs = append(errs, closeSimEngines(st.engines))
	if st.stopRun != nil {
		st.stopRun()
		for range running {
			<-st.ran
		}
	}
	for i, r := range st.replicas {
		if err := r.Close(sctx); err != nil {
			errs = append(errs, fmt.Errorf("replica %d: %w", i, err))
		}
	}
	for _, nc := range st.conns {
		nc.Close()
	}
	if st.emb != nil {
		st.emb.Shutdown()
	}
	return errors.Join(errs...)
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
	var reply strings.Builder
	var usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			r.Code = "bad chunk"
			return r, ""
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != "" && r.TTFT == 0 {
				r.TTFT = time.Since(sent)
			}
			reply.WriteString(c.Delta.Content)
		}
		if chunk.Usage != nil && string(*chunk.Usage) != "null" {
			if err := json.Unmarshal(*chunk.Usage, &usage); err != nil {
				r.Code = "bad usage"
				return r, ""
			}
		}
	}
	if err := sc.Err(); err != nil || usage.PromptTokens == 0 {
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
