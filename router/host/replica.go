package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Replica states, in the order a replica goes through them.
const (
	stateNew      int32 = iota // New returned; Start not called
	stateStarting              // catching up with the event stream
	stateReady                 // serving
	stateDraining              // Close called: no new requests
	stateClosed
)

var stateNames = [...]string{"new", "starting", "ready", "draining", "closed"}

// Replica is one router replica: a prefix index, a scheduler and a
// predicted index per model, one bindings table, one membership view, and
// the NATS and HTTP APIs over them. Create it with New, then Start; Close
// shuts it down gracefully.
type Replica struct {
	cfg    Config
	id     string
	log    *slog.Logger
	nc     *nats.Conn
	js     jetstream.JetStream
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	m      *metrics

	models    map[string]*modelState // read-only after New
	modelList []string

	table     *bindings.Table
	tableObs  atomic.Pointer[bindings.Table] // table, for metric callbacks that may run during Start
	mem       atomic.Pointer[workers.Membership]
	loadSub   *workers.LoadSubscription
	loadStats atomic.Pointer[workers.LoadSubscription] // loadSub, for metric callbacks that may run during Start

	// The two parts beside the request path (doc.go): event intake and
	// replica sync. Start and Close run them; the request path and
	// membership reach them only through share and gate.
	intake *eventIntake
	peers  *peerSync
	share  peerSharer // peers
	gate   workerGate // intake

	apiSubs []*nats.Subscription // queue-group API, joined once ready
	httpSrv *http.Server
	httpLn  net.Listener
	handler http.Handler

	state    atomic.Int32
	ready    chan struct{}
	sem      chan struct{} // bounds route requests in flight (NATS and HTTP)
	routes   *msgPool      // runs NATS route messages (msgpool.go)
	fwd      chan struct{} // bounds lifecycle calls forwarded to other replicas
	bodyMax  bodyLimit     // the route body limit, derived from the workers (httpapi.go)
	inflight inflightGate  // every API call in progress
	bg       loops         // background loops: Close stops them and waits
	scratch  sync.Pool     // *routeScratch

	tracing bool         // a real TracerProvider was configured
	signer  *fenceSigner // makes and checks booking fences (fence.go)

	closeOnce sync.Once
	closeErr  error
}

// New validates cfg and builds a replica on nc; nothing touches NATS until
// Start. nc must stay open until Close returns.
func New(nc *nats.Conn, cfg Config) (*Replica, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil NATS connection", ErrConfig)
	}
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("host: jetstream: %w", err)
	}
	r := &Replica{
		cfg:     cfg,
		id:      cfg.ReplicaID,
		log:     cfg.Logger.With("replica", cfg.ReplicaID),
		nc:      nc,
		js:      js,
		tracer:  cfg.Telemetry.TracerProvider.Tracer(instrumentationName),
		tracing: !isNoopTracer(cfg.Telemetry.TracerProvider),
		prop:    cfg.Telemetry.Propagator,
		models:  make(map[string]*modelState, len(cfg.Models)),
		ready:   make(chan struct{}),
		sem:     make(chan struct{}, cfg.MaxInFlight),
		fwd:     make(chan struct{}, cfg.ForwardConcurrency),
		bg:      loops{stop: make(chan struct{})},
		signer:  newFenceSigner(),
	}
	r.routes = newMsgPool(r.serveRoute, r.bg.stop, &r.bg.wg)
	r.m, err = newMetrics(cfg.Telemetry.MeterProvider.Meter(instrumentationName))
	if err != nil {
		return nil, fmt.Errorf("host: metrics: %w", err)
	}
	for _, name := range cfg.Models {
		ms, err := r.newModel(name)
		if err != nil {
			return nil, err
		}
		r.models[name] = ms
		r.modelList = append(r.modelList, name)
	}
	r.intake = &eventIntake{cfg: &r.cfg, log: r.log, js: js, m: r.m, models: r.models, modelList: r.modelList}
	r.peers = &peerSync{nc: nc, id: r.id, prefix: cfg.Prefix, every: cfg.BookingSyncInterval, log: r.log, m: r.m, bg: &r.bg}
	for _, name := range r.modelList {
		r.peers.models = append(r.peers.models, r.models[name])
	}
	r.share, r.gate = r.peers, r.intake
	r.handler = r.newHTTPHandler()
	if err := r.registerObservers(cfg.Telemetry.MeterProvider.Meter(instrumentationName)); err != nil {
		return nil, fmt.Errorf("host: metrics: %w", err)
	}
	return r, nil
}

// ID returns the replica id.
func (r *Replica) ID() string { return r.id }

// Models returns the models this replica routes.
func (r *Replica) Models() []string { return append([]string(nil), r.modelList...) }

// Handler returns the HTTP API (routes, lifecycle, workers, sessions,
// health, metrics).
func (r *Replica) Handler() http.Handler { return r.handler }

// HTTPAddr returns the address the HTTP API listens on, or "" when
// Config.HTTPAddr was empty.
func (r *Replica) HTTPAddr() string {
	if r.httpLn == nil {
		return ""
	}
	return r.httpLn.Addr().String()
}

// Ready is closed once the replica serves requests.
func (r *Replica) Ready() <-chan struct{} { return r.ready }

// IsReady reports whether the replica serves requests.
func (r *Replica) IsReady() bool { return r.state.Load() == stateReady }

// Start sets the replica up and returns once it is ready (caught up with
// the event stream, membership and bindings loaded, API subscribed), or
// with an error. ctx bounds the start-up only. On error, call Close.
//
// In order: set up (create or verify) the event stream and the buckets,
// open the bindings table, start the schedulers and replica sync, watch
// worker membership and load reports and wait for the registry, catch the
// indexes up (the newest index snapshot that passes verification, when
// enabled, then the stream from there), then join the route queue group.
func (r *Replica) Start(ctx context.Context) error {
	if !r.state.CompareAndSwap(stateNew, stateStarting) {
		return fmt.Errorf("host: Start called in state %s", stateNames[r.state.Load()])
	}
	if r.cfg.HTTPAddr != "" {
		if err := r.startHTTP(); err != nil {
			return err
		}
	}
	t0 := time.Now()
	if err := r.setUpStreams(ctx); err != nil {
		return err
	}
	if err := r.startBindings(ctx); err != nil {
		return err
	}
	if err := r.startModels(ctx); err != nil {
		return err
	}
	if err := r.startMembership(ctx); err != nil {
		return err
	}
	startSeq, err := r.catchUp(ctx)
	if err != nil {
		return err
	}
	if err := r.subscribeAPI(); err != nil {
		return err
	}
	if r.cfg.SnapshotInterval > 0 {
		r.bg.every(r.cfg.SnapshotInterval, r.intake.writeSnapshots)
	}
	r.bg.every(time.Second, r.upkeep)
	return r.becomeReady(t0, startSeq)
}

// startBindings opens the bindings table with the replica's id, logger,
// replicas and liveness.
func (r *Replica) startBindings(ctx context.Context) error {
	bcfg := r.cfg.Bindings
	bcfg.ReplicaID = r.id
	bcfg.Logger = r.log.With("component", "bindings")
	if bcfg.Replicas == 0 {
		bcfg.Replicas = r.cfg.StreamReplicas
	}
	bcfg.Liveness = bindings.LivenessFunc(r.workerLive)
	table, err := r.openBindings(ctx, bcfg)
	if err != nil {
		return err
	}
	r.table = table
	r.tableObs.Store(table)
	return nil
}

// startModels starts every model's scheduler, replica sync (the peers'
// bookings and decisions in, this replica's out) and the loops that record
// decisions into the predicted indexes.
func (r *Replica) startModels(ctx context.Context) error {
	for _, name := range r.modelList {
		if err := r.models[name].sched.Start(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("host: scheduler of model %q: %w", name, err)
		}
	}
	if err := r.peers.start(); err != nil {
		return err
	}
	for _, ms := range r.models {
		if ms.pred != nil {
			r.bg.run(ms.predLoop)
		}
	}
	return nil
}

// catchUp waits for the worker registry, then (unless approximate) for the
// event intake to catch the indexes up with the stream. It returns the
// stream sequence the intake started at.
func (r *Replica) catchUp(ctx context.Context) (uint64, error) {
	// The registry first: only registered workers' events and snapshot
	// entries are let into the index.
	if err := r.mem.Load().WaitReady(ctx); err != nil {
		return 0, fmt.Errorf("host: loading worker registry: %w", err)
	}
	// Approximate mode has no event stream to catch up with: the index
	// starts empty and fills with this replica's (and its peers')
	// decisions.
	if r.cfg.Approximate {
		return 0, nil
	}
	return r.intake.catchUp(ctx)
}

// becomeReady marks the replica ready (unless Close came first) and logs
// how it started.
func (r *Replica) becomeReady(t0 time.Time, startSeq uint64) error {
	if !r.state.CompareAndSwap(stateStarting, stateReady) {
		return fmt.Errorf("%w: closed while starting", api.ErrShuttingDown)
	}
	close(r.ready)
	r.log.Info("router replica ready", "models", r.modelList, "workers", r.mem.Load().Len(), "approximate", r.cfg.Approximate,
		"event_seq", r.intake.subscribedSeq(), "start_seq", startSeq, "took", time.Since(t0).Round(time.Millisecond),
		"index_max_entries", r.cfg.IndexLimits.MaxEntries, "index_max_entries_per_worker", r.cfg.IndexLimits.MaxEntriesPerWorker)
	return nil
}

// upkeep is the once-a-second upkeep: the held event batches' grace, the
// predicted indexes' TTL and (with an event stream) the event lag gauge.
func (r *Replica) upkeep() {
	now := time.Now()
	r.intake.expire(now)
	for _, ms := range r.models {
		if ms.pred != nil {
			ms.pred.Prune(now)
		}
	}
	if !r.cfg.Approximate {
		r.intake.measureLag()
	}
}

func (r *Replica) startHTTP() error {
	ln, err := net.Listen("tcp", r.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("host: HTTP listen %s: %w", r.cfg.HTTPAddr, err)
	}
	r.httpLn = ln
	// No WriteTimeout: it would count the wait in the scheduler queue;
	// each reply sets its own write deadline instead (setWriteDeadline).
	r.httpSrv = &http.Server{
		Handler:           r.handler,
		ReadHeaderTimeout: r.cfg.HTTPReadHeaderTimeout,
		ReadTimeout:       r.cfg.HTTPReadTimeout,
		IdleTimeout:       r.cfg.HTTPIdleTimeout,
		MaxHeaderBytes:    r.cfg.HTTPMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(r.log.Handler(), slog.LevelWarn),
	}
	r.bg.run(func(<-chan struct{}) {
		if err := r.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("HTTP server stopped", "err", err)
		}
	})
	r.log.Info("HTTP API listening", "addr", ln.Addr().String())
	return nil
}

// Close shuts the replica down gracefully: it stops taking requests (leaves
// the queue group and readiness), lets in-flight requests and binding
// commits finish (bounded by ctx), publishes the last booking changes,
// stops the event subscriber, membership and schedulers, and flushes the
// connection. The connection itself stays open (the caller owns it).
// Idempotent.
func (r *Replica) Close(ctx context.Context) error {
	r.closeOnce.Do(func() { r.closeErr = r.close(ctx) })
	return r.closeErr
}

func (r *Replica) close(ctx context.Context) error {
	prev := r.state.Swap(stateDraining)
	r.log.Info("router replica draining", "was", stateNames[prev])
	var errs []error
	// 1. Stop taking requests: drain the queue-group subscriptions (the
	// server stops sending us new requests; already delivered ones are
	// handled), and stop the HTTP listener.
	for _, s := range r.apiSubs {
		if err := s.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, fmt.Errorf("drain %s: %w", s.Subject, err))
		}
	}
	if r.httpSrv != nil {
		if err := r.httpSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
		}
	}
	for _, s := range r.apiSubs {
		waitDrained(ctx, s)
	}
	// 2. Finish in-flight requests (their binding commits included).
	done := make(chan struct{})
	go func() { r.inflight.wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("waiting for in-flight requests: %w", ctx.Err()))
	}
	// 3. Background: snapshots, booking sync (flushes what is buffered),
	// event subscriber, membership, load reports, schedulers.
	close(r.bg.stop)
	r.peers.unsubscribe()
	r.intake.stop()
	if m := r.mem.Load(); m != nil {
		m.Stop()
	}
	if r.loadSub != nil {
		_ = r.loadSub.Stop()
	}
	bgDone := make(chan struct{})
	go func() { r.bg.wg.Wait(); close(bgDone) }()
	select {
	case <-bgDone:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("waiting for background loops: %w", ctx.Err()))
	}
	for _, name := range r.modelList {
		r.models[name].close()
	}
	if r.table != nil {
		if err := r.table.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if !r.nc.IsClosed() {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second) // FlushWithContext needs a deadline
		err := r.nc.FlushWithContext(fctx)
		cancel()
		if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, fmt.Errorf("flush: %w", err))
		}
	}
	r.state.Store(stateClosed)
	r.log.Info("router replica closed")
	return errors.Join(errs...)
}

// waitDrained waits until a draining subscription has handed over every
// message it had.
func waitDrained(ctx context.Context, s *nats.Subscription) {
	for s.IsValid() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// workerLive is the bindings table's liveness: a worker is live until the
// membership view confirms its departure, whatever its state: a draining
// worker keeps its sessions until it deregisters or its drain deadline
// passes, and a suspect one (its key vanished, as in a registry failover)
// until the departure grace passes. A Hard binding moves only once this is
// false.
func (r *Replica) workerLive(worker string) bool {
	m := r.mem.Load()
	return m == nil || m.Live(worker)
}

// enter admits one API call, or says why not. While the replica drains,
// calls are still admitted: they are the requests the transports had
// already accepted (a draining subscription hands over what it holds, the
// HTTP server finishes requests it has read), and graceful shutdown means
// answering them. Once every transport has stopped and the calls in flight
// are done, the gate closes and later calls are refused.
func (r *Replica) enter() *api.Error {
	switch r.state.Load() {
	case stateNew, stateStarting:
		return api.NewError(api.CodeNotReady, "replica "+r.id+" is catching up with the event stream", nil)
	}
	if !r.inflight.enter() {
		return api.NewError(api.CodeShuttingDown, "replica "+r.id+" is shutting down", nil)
	}
	return nil
}

func (r *Replica) leave() { r.inflight.leave() }

// inflightGate counts calls in progress. Unlike a sync.WaitGroup it allows
// enter to race with wait: calls that enter before wait has seen zero are
// waited for, later ones are refused.
type inflightGate struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{} // closed when n reaches 0 after wait began
}

func (g *inflightGate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

func (g *inflightGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.n == 0 && g.zero != nil {
		close(g.zero)
		g.zero = nil
		g.closed = true
	}
}

// wait returns once no call is in progress; from then on enter refuses.
func (g *inflightGate) wait() {
	g.mu.Lock()
	if g.n == 0 {
		g.closed = true
		g.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	g.zero = ch
	g.mu.Unlock()
	<-ch
}

// model returns the state of a served model.
func (r *Replica) model(name string) (*modelState, *api.Error) {
	if name == "" {
		return nil, api.BadField("model", "is required")
	}
	ms, ok := r.models[name]
	if !ok {
		return nil, api.BadField("model", "%q is not routed by this replica (models: %v)", name, r.modelList)
	}
	return ms, nil
}

// defaultModel is the model of a call that names none: the only model,
// when the replica routes exactly one.
func (r *Replica) defaultModel(name string) string {
	if name == "" && len(r.modelList) == 1 {
		return r.modelList[0]
	}
	return name
}

// loops are the replica's background loops: each runs until stop closes,
// and Close waits for them all.
type loops struct {
	stop chan struct{}
	wg   sync.WaitGroup
}

// run starts f as one of the loops.
func (l *loops) run(f func(stop <-chan struct{})) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f(l.stop)
	}()
}

// every starts a loop that calls f every d, the first time after d.
func (l *loops) every(d time.Duration, f func()) {
	l.run(func(stop <-chan struct{}) {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			f()
		}
	})
}

// peerSharer is what the request path needs of replica sync (peerSync):
// queue a booking change or a routing decision for the peers, never
// blocking.
type peerSharer interface {
	shareBooking(ms *modelState, ev scheduler.BookingEvent)
	shareDecision(ms *modelState, k workerref.Target, hashes []kvevents.SeqHash)
}

// workerGate is what membership needs of event intake (eventIntake): let
// a registered worker's events into its model's index (and apply what was
// held for it), or drop what is held for a departed one.
type workerGate interface {
	admit(ms *modelState, i workers.Info)
	forget(ms *modelState, worker string)
}
