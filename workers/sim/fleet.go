package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FleetConfig configures N simulated workers in one process.
type FleetConfig struct {
	Count    int    // number of workers, >= 1
	IDPrefix string // worker ids are <IDPrefix>-<i>, i from 0; default "sim"

	// Engine is the template of every worker's Config; Worker and
	// NewEmitter are set per worker. Leave Clock nil (wall clock): a shared
	// VirtualClock would add the workers' step times up.
	Engine Config
	// Roles are the workers' roles by index (a prefill/decode fleet);
	// workers past its end take Engine.Role.
	Roles []workers.Role

	// NewEmitter makes the emitter of one worker's rank for one epoch, e.g.
	// PublisherFactory(js, ...). nil = events are dropped.
	NewEmitter func(worker string, rank uint32, epoch uint64) (EventEmitter, error)

	Registry     workers.RegistryConfig // registry bucket, TTL, heartbeat (TakeOver is set on Restart)
	LoadInterval time.Duration          // load report period; workers.DefaultLoadInterval
	Drain        workers.DrainConfig    // graceful stop; InFlight and AfterDeregister are set per worker
	Logger       *slog.Logger           // default slog.Default()
}

// Fleet runs Count engines in one process. Each worker serves its endpoint,
// runs its step loop, registers in the registry (one key, heartbeat),
// publishes its load and emits its events through its own emitters.
//
//	f, err := sim.NewFleet(sim.FleetConfig{Count: n, Engine: sim.Config{Model: m},
//		NewEmitter: sim.PublisherFactory(js, kvevents.PublisherConfig{Prefix: p, Model: m})})
//	err = f.Start(ctx, nc, js)
//	<-ctx.Done()
//	err = f.Stop(shutdownCtx) // drain, deregister, Cleared, close
type Fleet struct {
	cfg FleetConfig
	log *slog.Logger
	ws  []*fleetWorker

	mu      sync.Mutex
	started bool
	stopped bool
	nc      *nats.Conn
	js      jetstream.JetStream
}

type fleetWorker struct {
	e      *Engine
	srv    *Server
	reg    *workers.Registration
	load   *workers.LoadReporter
	cancel context.CancelFunc
	done   chan struct{}
}

// NewFleet builds the engines (and their first emitters). Nothing runs
// until Start.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if cfg.Count < 1 {
		return nil, fmt.Errorf("%w: fleet count %d", ErrBadConfig, cfg.Count)
	}
	if cfg.IDPrefix == "" {
		cfg.IDPrefix = "sim"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &Fleet{cfg: cfg, log: cfg.Logger.With("component", "sim.fleet")}
	for i := range cfg.Count {
		ec := cfg.Engine
		ec.Worker = cfg.IDPrefix + "-" + strconv.Itoa(i)
		if i < len(cfg.Roles) {
			ec.Role = cfg.Roles[i]
		}
		ec.NewEmitter = nil
		if cfg.NewEmitter != nil {
			worker, mk := ec.Worker, cfg.NewEmitter
			ec.NewEmitter = func(rank uint32, epoch uint64) (EventEmitter, error) { return mk(worker, rank, epoch) }
		}
		e, err := New(ec)
		if err != nil {
			f.closeEngines(context.Background())
			return nil, fmt.Errorf("sim: fleet worker %s: %w", ec.Worker, err)
		}
		f.ws = append(f.ws, &fleetWorker{e: e})
	}
	return f, nil
}

// Engines returns the fleet's engines, in id order.
func (f *Fleet) Engines() []*Engine {
	out := make([]*Engine, len(f.ws))
	for i, w := range f.ws {
		out[i] = w.e
	}
	return out
}

func (f *Fleet) closeEngines(ctx context.Context) {
	for _, w := range f.ws {
		_ = w.e.Close(ctx)
	}
}

// Start makes every worker serve on nc, run its step loop, register with js
// and report its load. On error, what was started is stopped.
func (f *Fleet) Start(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started {
		return fmt.Errorf("%w: fleet started twice", ErrRunning)
	}
	f.started = true
	f.nc, f.js = nc, js
	for _, w := range f.ws {
		if err := f.startWorker(ctx, w, nc, js, f.cfg.Registry); err != nil {
			f.stopped = true
			f.abortAll()
			return err
		}
	}
	f.log.Info("fleet started", "workers", len(f.ws), "model", f.cfg.Engine.Model)
	return nil
}

func (f *Fleet) startWorker(ctx context.Context, w *fleetWorker, nc *nats.Conn, js jetstream.JetStream, rc workers.RegistryConfig) error {
	runCtx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		_ = w.e.Run(runCtx)
	}()
	// Routers drop a worker whose key vanished; when the heartbeat creates
	// it again, tell them the whole cache again.
	user := rc.OnRecreate
	rc.OnRecreate = func(i workers.Info) {
		w.e.Reannounce()
		if user != nil {
			user(i)
		}
	}
	var err error
	if w.srv, err = Serve(runCtx, nc, w.e); err != nil {
		return err
	}
	if w.reg, err = workers.Register(ctx, js, rc, w.e.Info()); err != nil {
		return fmt.Errorf("sim: register %s: %w", w.e.cfg.Worker, err)
	}
	w.load, err = workers.StartLoadReporter(nc, workers.LoadReporterConfig{
		Prefix: w.e.cfg.Prefix, Interval: f.cfg.LoadInterval, Source: w.e.Load, Logger: f.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("sim: load reporter %s: %w", w.e.cfg.Worker, err)
	}
	return nil
}

// abortAll tears everything down without draining (start failed).
func (f *Fleet) abortAll() {
	for _, w := range f.ws {
		f.stopWorker(w)
		_ = w.e.Close(context.Background())
	}
}

// stopWorker stops the load reporter, the server and the step loop, and the
// heartbeat (the key is left to expire).
func (f *Fleet) stopWorker(w *fleetWorker) {
	if w.load != nil {
		w.load.Stop()
		w.load = nil
	}
	if w.reg != nil {
		w.reg.Stop()
		w.reg = nil
	}
	if w.srv != nil {
		_ = w.srv.Stop()
		w.srv = nil
	}
	if w.cancel != nil {
		w.cancel()
		<-w.done
		w.cancel = nil
	}
}

// Restart simulates a crash and restart of worker i: its requests fail, its
// cache empties, it gets a new epoch (new emitters, Cleared first) and
// registers again under the same id, taking the key over at once.
func (f *Fleet) Restart(ctx context.Context, i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.ws) {
		return fmt.Errorf("%w: fleet worker %d of %d", ErrBadConfig, i, len(f.ws))
	}
	if !f.started || f.stopped {
		return fmt.Errorf("%w: fleet not running", ErrClosed)
	}
	w := f.ws[i]
	f.stopWorker(w)
	if err := w.e.Restart(ctx); err != nil {
		return err
	}
	rc := f.cfg.Registry
	rc.TakeOver = true
	return f.startWorker(ctx, w, f.nc, f.js, rc)
}

// Stop drains every worker at once (workers.Registration.Drain: draining
// state, wait for in-flight requests, delete the key, then the engine
// closes, emitting Cleared and closing its emitters), then stops serving and
// reporting. It returns the joined errors.
func (f *Fleet) Stop(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return nil
	}
	f.stopped = true
	if !f.started {
		f.closeEngines(ctx)
		return nil
	}
	errs := make([]error, len(f.ws))
	var wg sync.WaitGroup
	for i, w := range f.ws {
		wg.Go(func() {
			dc := f.cfg.Drain
			dc.InFlight = w.e.InFlight
			dc.AfterDeregister = w.e.Close
			if w.reg != nil {
				errs[i] = w.reg.Drain(ctx, dc)
				w.reg = nil
			}
			f.stopWorker(w)
			if err := w.e.Close(ctx); err != nil && errs[i] == nil {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	f.log.Info("fleet stopped", "workers", len(f.ws))
	return errors.Join(errs...)
}

// Dump merges every engine's Dump.
func (f *Fleet) Dump() map[workerref.Target][]kvevents.SeqHash {
	out := map[workerref.Target][]kvevents.SeqHash{}
	for _, w := range f.ws {
		maps.Copy(out, w.e.Dump())
	}
	return out
}

// PublisherFactory returns a NewEmitter for FleetConfig that makes one
// kvevents.Publisher per (worker, rank, epoch): base gives Prefix, Model and
// the batching settings; Worker, Rank and Epoch are set per call. The event
// stream must exist (kvevents.EnsureStream). With base.SeqKeyed the engine's
// events are published sequence-keyed (seqKeyedEmitter). For a single
// Engine, wrap it:
//
//	mk := PublisherFactory(js, base)
//	cfg.NewEmitter = func(rank uint32, epoch uint64) (EventEmitter, error) { return mk(cfg.Worker, rank, epoch) }
func PublisherFactory(js jetstream.JetStream, base kvevents.PublisherConfig) func(worker string, rank uint32, epoch uint64) (EventEmitter, error) {
	return func(worker string, rank uint32, epoch uint64) (EventEmitter, error) {
		pc := base
		pc.Worker, pc.Rank, pc.Epoch = worker, rank, epoch
		p, err := kvevents.NewPublisher(js, pc)
		if err != nil {
			return nil, err
		}
		if pc.SeqKeyed {
			return &seqKeyedEmitter{Publisher: p, salt: engineSalt(worker, rank)}, nil
		}
		return p, nil
	}
}

// seqKeyedEmitter publishes a simulated engine's events sequence-keyed
// (kvevents.Batch.SeqKeyed). No counting is needed: the engine's block id
// is its sequence hash xor a per-rank salt, so each sequence hash is one
// engine block, stored and removed once. Emit rewrites each event into
// buffers the publisher copies from; the mutex keeps them one caller's.
type seqKeyedEmitter struct {
	*kvevents.Publisher
	salt   uint64
	mu     sync.Mutex
	blocks []kvevents.StoredBlock
	seqs   []kvevents.SeqHash
}

func (e *seqKeyedEmitter) Emit(ev kvevents.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev.Parent, ev.HasParent = 0, false
	if len(ev.Blocks) > 0 {
		e.blocks = e.blocks[:0]
		for _, b := range ev.Blocks {
			e.blocks = append(e.blocks, kvevents.StoredBlock{Seq: b.Seq})
		}
		ev.Blocks = e.blocks
	}
	if len(ev.Removed) > 0 {
		e.seqs = e.seqs[:0]
		for _, h := range ev.Removed {
			e.seqs = append(e.seqs, kvevents.SeqHash(uint64(h)^e.salt))
		}
		ev.Removed, ev.RemovedSeqs = nil, e.seqs
	}
	return e.Publisher.Emit(ev)
}
