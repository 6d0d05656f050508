package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/bridge"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// RealConfig is the real path's deployment (StartReal).
type RealConfig struct {
	Model                     string
	Engines                   int
	KVBlocks                  int // per engine
	BlockSize                 int // engines' and routers' block size
	MaxBatchedTokens, MaxSeqs int // engines' limits (0 = sim defaults)
	Speedup                   float64
	MaxModelLen               int    // the engines' context limit (default 32,768)
	IDPrefix                  string // engine i is IDPrefix + i (default "engine-")
	// Replicas are the router replicas' configurations, one per replica
	// (their Models must include Model).
	Replicas []host.Config
	// Registry is the bridges' registry timing.
	Registry workers.RegistryConfig
	// MetricsInterval is the bridges' /metrics scrape period, which is
	// their load report period (default 100 ms).
	MetricsInterval time.Duration
	Logger          *slog.Logger
	// Gateway is the gateway's telemetry (zero: none); the replicas'
	// is in their Config.
	Gateway gateway.Telemetry
}

// Real is the real path a request takes in production, in one process:
// simulated engines as `kvrouter sim serve` runs them (vLLM's HTTP API on
// a loopback listener, vLLM KV events over ZMQ PUB with a replay socket),
// one workers/bridge per engine (ZMQ SUB → JetStream, /health and /metrics
// scrapes, registry), router replicas (router/host) on an embedded NATS
// server, and one OpenAI gateway over the NATS route API. `kvrouter demo`
// and `kvrouter bench replay --path gateway` both run it.
type Real struct {
	// GatewayURL is the gateway's base URL (http://127.0.0.1:port).
	GatewayURL string
	// Workers are the engines' worker ids, in order.
	Workers []string

	emb        *natsconn.Embedded
	conns      []*nats.Conn
	replicas   []*host.Replica
	engines    []*realEngine
	stopRun    context.CancelFunc
	ran        chan error
	running    int
	bridges    []chan error
	stopBridge context.CancelFunc
	gw         *http.Server
	gwClient   *http.Client
	log        *slog.Logger
}

// realEngine is one engine with its faces.
type realEngine struct {
	eng    *sim.Engine
	events *sim.VLLMEvents
	http   *http.Server
	ln     net.Listener
}

// StartReal starts the whole path and returns once every replica lists
// every engine as a ready worker with a load report from its bridge. On an
// error it stops what it started.
func StartReal(ctx context.Context, cfg RealConfig) (r *Real, err error) {
	if cfg.Engines < 1 || len(cfg.Replicas) < 1 || cfg.BlockSize < 1 || cfg.Model == "" {
		return nil, fmt.Errorf("stack: the real path needs engines, replicas, a block size and a model (engines %d, replicas %d, block size %d, model %q)",
			cfg.Engines, len(cfg.Replicas), cfg.BlockSize, cfg.Model)
	}
	if cfg.MaxModelLen == 0 {
		cfg.MaxModelLen = 32768
	}
	if cfg.IDPrefix == "" {
		cfg.IDPrefix = "engine-"
	}
	if cfg.MetricsInterval <= 0 {
		cfg.MetricsInterval = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r = &Real{ran: make(chan error, cfg.Engines), log: cfg.Logger}
	defer func() {
		if err != nil {
			_ = r.Close()
			r = nil
		}
	}()
	labeled(componentNATS, func() { r.emb, err = natsconn.StartEmbedded(natsconn.Config{Embedded: true}, cfg.Logger) })
	if err != nil {
		return r, err
	}
	var nc *nats.Conn
	labeled(componentGateway, func() { nc, _, err = r.connect("real-gateway") })
	if err != nil {
		return r, err
	}
	// The replicas create the event stream and the buckets (they own
	// their configuration); the bridges start after them.
	for i, hc := range cfg.Replicas {
		if labeled(componentRouter, func() { err = r.startReplica(ctx, i, hc) }); err != nil {
			return r, err
		}
	}
	if labeled(componentEngine, func() { err = r.startEngines(cfg) }); err != nil {
		return r, err
	}
	bctx, stop := context.WithCancel(context.Background())
	r.stopBridge = stop
	for i, e := range r.engines {
		if labeled(componentBridge, func() { err = r.startBridge(bctx, cfg, r.Workers[i], e) }); err != nil {
			return r, err
		}
	}
	if err := r.waitReady(ctx, cfg.Model, len(r.engines)); err != nil {
		return r, err
	}
	r.gwClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	g, err := gateway.New(gateway.Config{Router: gateway.ClientRouter{C: api.NewClient(nc, "", cfg.Gateway.Propagator)}, Models: []string{cfg.Model},
		HTTPClient: r.gwClient, Logger: cfg.Logger, Telemetry: cfg.Gateway})
	if err != nil {
		return r, fmt.Errorf("stack: gateway: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, fmt.Errorf("stack: gateway listener: %w", err)
	}
	r.gw = &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	labeled(componentGateway, func() { go r.gw.Serve(ln) })
	r.GatewayURL = "http://" + ln.Addr().String()
	return r, nil
}

// startReplica connects, creates and starts router replica i.
func (r *Real) startReplica(ctx context.Context, i int, hc host.Config) error {
	rnc, _, err := r.connect(fmt.Sprintf("real-replica-%d", i))
	if err != nil {
		return err
	}
	rep, err := host.New(rnc, hc)
	if err != nil {
		return fmt.Errorf("stack: replica %d: %w", i, err)
	}
	r.replicas = append(r.replicas, rep)
	if err := rep.Start(ctx); err != nil {
		return fmt.Errorf("stack: replica %d start: %w", i, err)
	}
	return nil
}

// Replicas are the router replicas, for reading their state.
func (r *Real) Replicas() []*host.Replica { return r.replicas }

// connect opens one more in-process connection to the embedded server.
func (r *Real) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect("", nats.InProcessServer(r.emb.Server), nats.Name(name))
	if err != nil {
		return nil, nil, fmt.Errorf("stack: embedded nats: %w", err)
	}
	r.conns = append(r.conns, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("stack: jetstream: %w", err)
	}
	return nc, js, nil
}

// startEngines starts engines as `kvrouter sim serve` does, with vLLM KV
// events on ephemeral loopback ZMQ ports and HTTP on 127.0.0.1:0.
func (r *Real) startEngines(cfg RealConfig) error {
	runCtx, stop := context.WithCancel(context.Background())
	r.stopRun = stop
	for i := range cfg.Engines {
		id := fmt.Sprintf("%s%d", cfg.IDPrefix, i)
		e := &realEngine{}
		r.engines = append(r.engines, e)
		r.Workers = append(r.Workers, id)
		ec := vllmzmq.DefaultConfig()
		ec.EnableKVCacheEvents, ec.Topic = true, "kv"
		// The PUB endpoint binds only with a wildcard host (vLLM's rule, as
		// `sim serve`'s default tcp://*:5557); the replay socket always binds.
		ec.Endpoint, ec.ReplayEndpoint = "tcp://*:0", "tcp://127.0.0.1:0"
		var err error
		if e.events, err = sim.NewVLLMEvents(ec, 1, cfg.Logger); err != nil {
			return fmt.Errorf("stack: engine %s: KV events: %w", id, err)
		}
		if e.eng, err = sim.New(sim.Config{Worker: id, Model: cfg.Model, BlockSize: cfg.BlockSize, KVBlocks: cfg.KVBlocks,
			MaxBatchedTokens: cfg.MaxBatchedTokens, MaxSeqs: cfg.MaxSeqs, Speedup: cfg.Speedup,
			NewEmitter: e.events.Factory()}); err != nil {
			return fmt.Errorf("stack: engine %s: %w", id, err)
		}
		face, err := vllmapi.New(vllmapi.Config{Engine: e.eng, Model: cfg.Model, MaxModelLen: cfg.MaxModelLen, Logger: cfg.Logger})
		if err != nil {
			return fmt.Errorf("stack: engine %s: %w", id, err)
		}
		if e.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return fmt.Errorf("stack: engine %s: %w", id, err)
		}
		e.http = &http.Server{Handler: face, ReadHeaderTimeout: 10 * time.Second}
		r.running++
		go func() { r.ran <- e.eng.Run(runCtx) }()
		go e.http.Serve(e.ln)
	}
	return nil
}

func (r *Real) startBridge(ctx context.Context, cfg RealConfig, id string, e *realEngine) error {
	nc, js, err := r.connect("real-bridge-" + id)
	if err != nil {
		return err
	}
	p := e.events.Publisher(0)
	b, err := bridge.New(bridge.Config{EngineURL: "http://" + e.ln.Addr().String(), KVEvents: p.Endpoint(),
		KVReplay: p.ReplayEndpoint(), Topic: "kv", Model: cfg.Model, WorkerID: id, RouterBlockSize: cfg.BlockSize,
		MaxBatchedTokens: cfg.MaxBatchedTokens, MaxSeqs: cfg.MaxSeqs,
		MetricsInterval: cfg.MetricsInterval, HealthInterval: 200 * time.Millisecond,
		Events: kvevents.PublisherConfig{MaxDelay: time.Millisecond}, Registry: cfg.Registry,
		DrainWait: 2 * time.Second, Logger: cfg.Logger.With("bridge", id)}, nc, js)
	if err != nil {
		return fmt.Errorf("stack: bridge %s: %w", id, err)
	}
	done := make(chan error, 1)
	r.bridges = append(r.bridges, done)
	go func() { done <- b.Run(ctx) }()
	return nil
}

// waitReady waits until every replica lists n ready workers with a load
// report from their bridges.
func (r *Real) waitReady(ctx context.Context, model string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ready := 0
		for _, rep := range r.replicas {
			if w, err := rep.Workers(model); err == nil && len(w.Workers) == n {
				ok := true
				for _, ws := range w.Workers {
					ok = ok && ws.State == "ready" && ws.Reported != nil
				}
				if ok {
					ready++
				}
			}
		}
		if ready == len(r.replicas) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack: waiting for %d replicas to list %d ready bridged engines (%d do): %w", len(r.replicas), n, ready, ctx.Err())
		case <-tick.C:
		}
	}
}

// Close stops the path from the client side inwards: gateway, bridges,
// engines, replicas, NATS.
func (r *Real) Close() error {
	var errs []error
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r.gw != nil {
		if r.gw.Shutdown(sctx) != nil {
			r.gw.Close()
		}
		r.gwClient.CloseIdleConnections()
	}
	if r.stopBridge != nil {
		r.stopBridge()
	}
	for i, done := range r.bridges {
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, fmt.Errorf("bridge %s: %w", r.Workers[i], err))
			}
		case <-sctx.Done():
			errs = append(errs, fmt.Errorf("bridge %s did not stop", r.Workers[i]))
		}
	}
	for _, e := range r.engines {
		if e.http != nil && e.http.Shutdown(sctx) != nil {
			e.http.Close()
		}
	}
	for _, e := range r.engines {
		if e.eng != nil {
			errs = append(errs, e.eng.Close(sctx))
		}
		if e.events != nil {
			errs = append(errs, e.events.Close())
		}
		if e.ln != nil {
			e.ln.Close() // already closed by Shutdown, or never served
		}
	}
	if r.stopRun != nil {
		r.stopRun()
		for range r.running {
			<-r.ran
		}
	}
	for i, rep := range r.replicas {
		if err := rep.Close(sctx); err != nil {
			errs = append(errs, fmt.Errorf("replica %d: %w", i, err))
		}
	}
	for _, nc := range r.conns {
		nc.Close()
	}
	if r.emb != nil {
		r.emb.Shutdown()
	}
	return errors.Join(errs...)
}
