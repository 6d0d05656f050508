package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options tune what New builds beyond replay.StackConfig.
type Options struct {
	Prefix string // subject prefix (default "kvr")
	// GenConns is the number of client connections the generate traffic is
	// spread over (default 4): one connection's reader would serialise every
	// streamed chunk.
	GenConns int
	// ReadyTimeout bounds the wait for replicas to be ready and to see the
	// whole fleet (default 30 s).
	ReadyTimeout time.Duration
	Logger       *slog.Logger
	// TrueCacheRouterLoad makes the true-cache policy take its load term
	// from a replica's load view (one workers call per decision, made under
	// its lock) instead of its own bookkeeping. Off by default: the extra
	// call serialises its decisions behind the replica.
	TrueCacheRouterLoad bool
}

// Factory returns a replay.StackFactory building stacks with these options.
func Factory(opt Options) replay.StackFactory {
	return func(ctx context.Context, cfg replay.StackConfig) (replay.Stack, error) {
		return New(ctx, cfg, opt)
	}
}

// Stack is a running fleet, its replicas and the client side.
type Stack struct {
	cfg      replay.StackConfig
	opt      Options
	emb      *natsconn.Embedded
	conns    []*nats.Conn
	fleet    *sim.Fleet
	replicas []*host.Replica
	client   *api.Client
	router   *router
	gen      *generator
	mirror   *Mirror
	workers  []string
	probe    *syncProbe // two or more replicas: how far their views drift apart
}

var _ replay.Stack = (*Stack)(nil)

// New starts everything and returns once every replica is ready and sees the
// whole fleet. On error what was started is stopped.
func New(ctx context.Context, cfg replay.StackConfig, opt Options) (_ *Stack, err error) {
	opt.applyDefaults()
	if cfg.Workers < 1 || cfg.Replicas < 1 || cfg.BlockSize < 1 || cfg.Model == "" {
		return nil, fmt.Errorf("%w: stack needs workers, replicas, block size and model (%+v)", replay.ErrConfig, cfg)
	}
	s := &Stack{cfg: cfg, opt: opt}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = s.Close(cctx)
			cancel()
		}
	}()
	wnc, js, err := s.startServer(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.startFleet(ctx, wnc, js); err != nil {
		return nil, err
	}
	if err := s.startReplicas(ctx); err != nil {
		return nil, err
	}
	if err := s.startClients(ctx); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	if len(s.replicas) >= 2 {
		s.probe = startSyncProbe(s.replicas[0], s.replicas[1], cfg.Model, 20*time.Millisecond)
	}
	return s, nil
}

func (o *Options) applyDefaults() {
	if o.Prefix == "" {
		o.Prefix = api.DefaultPrefix
	}
	if o.GenConns <= 0 {
		o.GenConns = 4
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// connect opens one in-process connection to the embedded server; Close
// closes it.
func (s *Stack) connect(ctx context.Context, name string) (*nats.Conn, error) {
	c := natsconn.Config{Embedded: true, Name: name}
	nc, err := natsconn.Connect(ctx, c, s.emb, nil)
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, nc)
	return nc, nil
}

// startServer starts the embedded server and the event stream, and returns
// the workers' connection.
func (s *Stack) startServer(ctx context.Context) (*nats.Conn, jetstream.JetStream, error) {
	var err error
	if s.emb, err = natsconn.StartEmbedded(natsconn.Config{Embedded: true}, nil); err != nil {
		return nil, nil, err
	}
	wnc, err := s.connect(ctx, "bench-workers")
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(wnc)
	if err != nil {
		return nil, nil, fmt.Errorf("stack: jetstream: %w", err)
	}
	// The event stream must exist before the first publish.
	if _, err := kvevents.EnsureStream(ctx, js, kvevents.StreamConfig{Prefix: s.opt.Prefix}); err != nil {
		return nil, nil, fmt.Errorf("stack: event stream: %w", err)
	}
	return wnc, js, nil
}

// startReplicas starts the router replicas, one connection each.
func (s *Stack) startReplicas(ctx context.Context) error {
	for i := 0; i < s.cfg.Replicas; i++ {
		nc, err := s.connect(ctx, "bench-replica-"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		r, err := host.New(nc, s.replicaConfig(i))
		if err != nil {
			return fmt.Errorf("stack: replica %d: %w", i, err)
		}
		s.replicas = append(s.replicas, r)
		if err := r.Start(ctx); err != nil {
			return fmt.Errorf("stack: start replica %d: %w", i, err)
		}
	}
	return nil
}

// startClients opens the client side: the route API client and the
// generate connections.
func (s *Stack) startClients(ctx context.Context) error {
	cnc, err := s.connect(ctx, "bench-client")
	if err != nil {
		return err
	}
	s.client = api.NewClient(cnc, s.opt.Prefix, nil)
	s.router = &router{c: s.client, model: s.cfg.Model, deadline: s.cfg.RouteDeadline}
	s.gen = &generator{}
	for i := 0; i < s.opt.GenConns; i++ {
		nc, err := s.connect(ctx, "bench-gen-"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		s.gen.conns = append(s.gen.conns, nc)
	}
	return nil
}

// Diagnostics implements replay.Diagnoser: with two or more replicas, how
// far the first two replicas' load and index views drifted apart.
func (s *Stack) Diagnostics() []string {
	if s.probe == nil {
		return nil
	}
	p := s.probe
	s.probe = nil
	return p.close()
}

func (s *Stack) startFleet(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
	cfg := s.cfg
	if cfg.Probe {
		s.mirror = NewMirror()
	}
	var publish func(worker string, rank uint32, epoch uint64) (sim.EventEmitter, error)
	if cfg.Policy.Events {
		// Sequence-keyed, as kvrouter bridge publishes: the routers keep no
		// engine map (docs/protocol.md, "Sequence-keyed batches").
		publish = sim.PublisherFactory(js, kvevents.PublisherConfig{Prefix: s.opt.Prefix, Model: cfg.Model, SeqKeyed: true})
	}
	mirror := s.mirror
	var newEmitter func(worker string, rank uint32, epoch uint64) (sim.EventEmitter, error)
	if publish != nil || mirror != nil {
		newEmitter = func(worker string, rank uint32, epoch uint64) (sim.EventEmitter, error) {
			e := &emitter{m: mirror, key: workerref.Target{Worker: worker, Rank: rank}}
			if publish != nil {
				next, err := publish(worker, rank, epoch)
				if err != nil {
					return nil, err
				}
				e.next = next
			}
			return e, nil
		}
	}
	f, err := sim.NewFleet(sim.FleetConfig{
		Count:    cfg.Workers,
		IDPrefix: "w",
		Engine: sim.Config{
			Model: cfg.Model, Prefix: s.opt.Prefix, BlockSize: cfg.BlockSize, KVBlocks: cfg.KVBlocks,
			MaxBatchedTokens: cfg.MaxBatchedTokens, MaxSeqs: cfg.MaxSeqs, Speedup: cfg.Speedup,
			Transfer: cfg.Transfer,
		},
		Roles:      cfg.Fleet.Roles(),
		NewEmitter: newEmitter,
		Registry:   registryConfig(s.opt.Logger),
		// Load reports every second of model time, as a real worker would:
		// at a speed-up a wall-clock second would leave the routers'
		// load corrections that many times staler.
		LoadInterval: loadInterval(cfg.Speedup),
		Logger:       s.opt.Logger,
	})
	if err != nil {
		return fmt.Errorf("stack: fleet: %w", err)
	}
	s.fleet = f
	if err := f.Start(ctx, nc, js); err != nil {
		return fmt.Errorf("stack: start fleet: %w", err)
	}
	for _, e := range f.Engines() {
		s.workers = append(s.workers, e.Config().Worker)
	}
	return nil
}

// registryConfig is shared by workers and replicas. The TTL is longer than
// the default 3 s so that a replay saturating both cores cannot starve a
// heartbeat into a departure: worker liveness is not what is measured here.
func registryConfig(log *slog.Logger) workers.RegistryConfig {
	return workers.RegistryConfig{TTL: 10 * time.Second, Heartbeat: time.Second, Logger: log}
}

func (s *Stack) replicaConfig(i int) host.Config {
	cfg := s.cfg
	mode := session.Hard
	if cfg.SessionMode == replay.SessionSoft {
		mode = session.Soft
	}
	hc := host.Config{
		ReplicaID: "bench-r" + strconv.Itoa(i),
		Prefix:    s.opt.Prefix,
		Models:    []string{cfg.Model},
		BlockSize: cfg.BlockSize,
		Registry:  registryConfig(s.opt.Logger),
		Bindings:  bindings.Config{DefaultMode: mode},
		Policy:    scheduler.PolicyConfig{Name: cfg.Policy.RouterPolicy, Params: cfg.Policy.RouterParams},
		Logger:    s.opt.Logger,
	}
	// The replicas' own time constants are meant in real time; the workload
	// runs Speedup times faster, so they shrink with it (a 5 s predicted
	// index would otherwise remember 5 x Speedup seconds of decisions).
	ttl := host.DefaultPredictedTTL
	if cfg.Policy.PredictedTTL != 0 {
		ttl = cfg.Policy.PredictedTTL
	}
	hc.PredictedTTL = max(10*time.Millisecond, time.Duration(float64(ttl)/cfg.Speedup))
	if ttl < 0 {
		hc.PredictedTTL = -1 // off
	}
	if cfg.Policy.Approximate {
		hc.Approximate = true
		hc.ApproxTTL = max(10*time.Millisecond, time.Duration(float64(host.DefaultApproxTTL)/cfg.Speedup))
	}
	if cfg.RouteDeadline > 0 {
		hc.DefaultDeadline = cfg.RouteDeadline
	}
	switch {
	case cfg.QueueThreshold < 0:
		hc.Scheduler.Thresholds, hc.Scheduler.ThresholdsSet = scheduler.Thresholds{}, true
	case cfg.QueueThreshold > 0:
		hc.Scheduler.Thresholds = scheduler.Thresholds{QueuePrefillFrac: cfg.QueueThreshold, QueueDecodeFrac: cfg.QueueThreshold}
		hc.Scheduler.ThresholdsSet = true
	}
	return hc
}

// waitReady waits for every replica's readiness, then until the route API
// lists the whole fleet on several answers in a row (the queue group spreads
// them over the replicas).
func (s *Stack) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opt.ReadyTimeout)
	defer cancel()
	for i, r := range s.replicas {
		select {
		case <-r.Ready():
		case <-ctx.Done():
			return fmt.Errorf("stack: replica %d not ready: %w", i, ctx.Err())
		}
	}
	want, streak := len(s.workers), 0
	for streak < 4*len(s.replicas) {
		resp, err := s.client.Workers(ctx, s.cfg.Model)
		switch {
		case err == nil && len(resp.Workers) >= want:
			streak++
			continue
		case ctx.Err() != nil:
			got := -1
			if resp != nil {
				got = len(resp.Workers)
			}
			return fmt.Errorf("stack: replicas do not see the %d workers (last answer %d, %v): %w", want, got, err, ctx.Err())
		}
		streak = 0
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// Router returns the route API client.
func (s *Stack) Router() replay.Router { return s.router }

// Generator returns the worker endpoint client.
func (s *Stack) Generator() replay.Generator { return s.gen }

// Workers lists the fleet's worker ids.
func (s *Stack) Workers() []string { return s.workers }

// Probe returns the cache mirror when it was asked for.
func (s *Stack) Probe() replay.CacheProbe {
	if s.mirror == nil {
		return nil
	}
	return s.mirror
}

// Loads returns the replicas' load view through the route API when
// Options.TrueCacheRouterLoad is set, else nil (true-cache keeps its own
// books).
func (s *Stack) Loads() replay.LoadProbe {
	if !s.opt.TrueCacheRouterLoad {
		return nil
	}
	return s.router
}

// CachedShares implements replay.ShareProber: each replica's cached-share
// estimate for the stack's model.
func (s *Stack) CachedShares() []float64 { return cachedShares(s.replicas, s.cfg.Model) }

func cachedShares(replicas []*host.Replica, model string) []float64 {
	out := make([]float64, len(replicas))
	for i, r := range replicas {
		out[i] = r.CachedShare(model)
	}
	return out
}

// Mirror is the exact cache copy (nil unless StackConfig.Probe).
func (s *Stack) Mirror() *Mirror { return s.mirror }

// Fleet is the simulated fleet.
func (s *Stack) Fleet() *sim.Fleet { return s.fleet }

// Close stops replicas, the fleet, the connections and the server.
func (s *Stack) Close(ctx context.Context) error {
	if s.probe != nil {
		s.probe.close()
		s.probe = nil
	}
	var errs []error
	for _, r := range s.replicas {
		if err := r.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.replicas = nil
	if s.fleet != nil {
		if err := s.fleet.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
		s.fleet = nil
	}
	for _, nc := range s.conns {
		nc.Close()
	}
	s.conns = nil
	if s.emb != nil {
		s.emb.Shutdown()
		s.emb = nil
	}
	return errors.Join(errs...)
}

// router adapts api.Client to replay.Router.
type router struct {
	c        *api.Client
	model    string
	deadline time.Duration
}

func (r *router) Route(ctx context.Context, req *replay.RouteRequest) (*replay.Routed, error) {
	hr := api.RouteRequest{
		V: api.APIVersion, RequestID: req.ID, Model: req.Model, BlockHashes: req.BlockHashes, BlockSize: req.BlockSize,
		InputTokens: req.InputTokens, SessionID: req.SessionID, ExpectedOutputTokens: req.ExpectedOutput,
		RoutingKey: req.RoutingKey, PD: req.PD,
	}
	if req.Pin != "" {
		hr.Pin = &api.WorkerRef{Worker: req.Pin}
	}
	if req.Prefer != "" {
		hr.Prefer = &api.WorkerRef{Worker: req.Prefer}
	}
	if r.deadline > 0 {
		hr.DeadlineMS = int(r.deadline / time.Millisecond)
	}
	resp, err := r.c.Route(ctx, &hr)
	if err != nil {
		var he *api.Error
		if errors.As(err, &he) {
			rejected := he.Status == 409 || he.Status == 503 || he.Status == api.StatusOverloaded
			return nil, &replay.RouteError{Code: he.Code, Rejected: rejected, Err: err}
		}
		return nil, &replay.RouteError{Code: "transport", Err: err}
	}
	out := &replay.Routed{Worker: resp.Worker, Endpoint: resp.Endpoint, Overlap: resp.OverlapBlocks, Handle: resp,
		QueueWait: time.Duration(resp.QueueWaitUS) * time.Microsecond}
	if resp.Binding != nil {
		out.Binding = resp.Binding.Outcome
	}
	if p := resp.Prefill; p != nil {
		out.Prefill = &replay.Routed{Worker: p.Worker, Endpoint: p.Endpoint, Overlap: p.OverlapBlocks, Handle: resp.PrefillBooking()}
	}
	return out, nil
}

// Loads asks one replica (the queue group picks it) for its load view.
func (r *router) Loads(ctx context.Context, out map[string]replay.LoadSample) error {
	resp, err := r.c.Workers(ctx, r.model)
	if err != nil {
		return err
	}
	for _, w := range resp.Workers {
		if w.Load == nil {
			continue
		}
		l := out[w.Worker]
		l.PrefillTokens += w.Load.PrefillTokens
		l.DecodeBlocks += w.Load.DecodeBlocks
		l.ActiveRequests += w.Load.ActiveRequests
		out[w.Worker] = l
	}
	return nil
}

func (r *router) PrefillDone(ctx context.Context, x *replay.Routed) error {
	return r.c.PrefillDone(ctx, r.model, x.Handle.(*api.RouteResponse))
}

func (r *router) Free(ctx context.Context, x *replay.Routed) error {
	return r.c.Free(ctx, r.model, x.Handle.(*api.RouteResponse))
}

// generator sends generate requests over a few connections.
type generator struct {
	conns []*nats.Conn
	next  atomic.Uint64
}

func (g *generator) Generate(ctx context.Context, endpoint string, req *sim.GenerateRequest, first func()) (*sim.GenerateReply, error) {
	nc := g.conns[g.next.Add(1)%uint64(len(g.conns))]
	return sim.Generate(ctx, nc, endpoint, req, func(*sim.GenerateReply) { first() })
}

func loadInterval(speedup float64) time.Duration {
	if v := os.Getenv("KVR_BENCH_LOAD_INTERVAL"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return max(20*time.Millisecond, time.Duration(float64(time.Second)/speedup))
}
