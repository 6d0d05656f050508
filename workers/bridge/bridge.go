package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/workers"
)

// Bridge joins one engine to the fleet. Build it with New, serve Handler
// on --http-addr, and Run it until the context ends (then it drains).
type Bridge struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	eng *engineClient
	met *metrics
	log *slog.Logger

	evalMu sync.Mutex // serialises evaluate

	// What Run learned and decided; read by Handler and tests.
	mu       sync.Mutex
	phase    string // why it is not ready ("" = ready)
	reg      *workers.Registration
	state    workers.State // last state written
	draining bool
	healthy  bool
	// failedChecks counts consecutive failed /health checks; healthy is
	// false from HealthFailures on.
	failedChecks int
	lastScrape   scrape // last good one
	blockSize    int
	kvBlocks     int

	ranks    []*rank
	adapters adapterTracker // the engine's LoRA adapters (adapters.go)
}

// New checks cfg and returns a bridge that has opened nothing yet. nc and js
// are the NATS connection and its JetStream context (the event stream must
// exist: kvevents.EnsureStream).
func New(cfg Config, nc *nats.Conn, js jetstream.JetStream) (*Bridge, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if nc == nil || js == nil {
		return nil, fmt.Errorf("%w: NATS connection and JetStream are required", ErrConfig)
	}
	log := cfg.Logger.With("component", "bridge", "worker", cfg.WorkerID, "engine", cfg.EngineURL)
	return &Bridge{cfg: cfg, nc: nc, js: js, eng: newEngineClient(cfg), met: newMetrics(true), log: log,
		phase: "waiting for the engine at " + cfg.EngineURL}, nil
}

// WorkerID returns the worker id the bridge registers.
func (b *Bridge) WorkerID() string { return b.cfg.WorkerID }

func (b *Bridge) notReady() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.phase != "" {
		return b.phase
	}
	if b.state != workers.StateReady {
		return "worker registered as " + string(b.state)
	}
	return ""
}

func (b *Bridge) setPhase(p string) {
	b.mu.Lock()
	b.phase = p
	b.mu.Unlock()
}

// Run waits for the engine, checks its block size, opens one event
// follower per rank, registers the worker, then keeps its state, load and
// events flowing until ctx ends; then it drains (state draining, wait for
// the engine's requests in flight up to DrainWait, deregister) and closes
// everything. An error before registration (block size mismatch, duplicate
// worker id) is returned at once; ctx ending is a clean stop (nil).
func (b *Bridge) Run(ctx context.Context) error {
	first, err := b.waitForEngine(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if err := b.configure(first); err != nil {
		b.setPhase(err.Error())
		return err
	}
	if err := b.openRanks(); err != nil {
		b.closeRanks(context.Background())
		return err
	}
	b.refreshServed(ctx)
	b.adapters.scraped(first.lora)
	served, loaded, maxLoRAs := b.adapters.lists()
	reg, err := workers.Register(ctx, b.js, b.cfg.Registry, workers.Info{
		ID: b.cfg.WorkerID, Model: b.cfg.Model, Endpoint: b.cfg.endpoint(), Ranks: b.rankIDs(),
		BlockSize: b.blockSize, KVBlocks: b.kvBlocks, MaxBatchedTokens: b.cfg.MaxBatchedTokens, MaxSeqs: b.cfg.MaxSeqs,
		Adapters: served, LoadedAdapters: workers.SortAdapters(loaded), MaxLoRAs: maxLoRAs,
		State:  workers.StateReady,
		Labels: map[string]string{"engine_format": b.cfg.EngineFormat},
		Role:   b.cfg.Role, BootstrapPort: b.cfg.BootstrapPort,
	})
	if err != nil {
		b.closeRanks(context.Background())
		if ctx.Err() != nil {
			return nil
		}
		b.setPhase("registration failed: " + err.Error())
		return fmt.Errorf("bridge: register %q: %w", b.cfg.WorkerID, err)
	}
	b.mu.Lock()
	b.reg, b.state, b.healthy, b.lastScrape, b.phase = reg, workers.StateReady, true, first, ""
	b.mu.Unlock()
	b.met.ready.Set(1)
	b.met.available.Set(1)
	b.log.Info("worker registered", "model", b.cfg.Model, "ranks", len(b.ranks), "block_size", b.blockSize, "kv_blocks", b.kvBlocks)

	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range b.ranks {
		wg.Go(func() {
			if err := r.run(runCtx); err != nil {
				b.log.Error("rank follower stopped", "rank", r.id, "err", err)
			}
		})
	}
	wg.Go(func() { b.scrapeLoop(runCtx) })
	wg.Go(func() { b.healthLoop(runCtx) })

	select {
	case <-ctx.Done():
		err = nil
	case <-reg.Done():
		err = fmt.Errorf("bridge: registration lost: %w", reg.Err())
	}
	derr := b.drain(reg)
	b.setPhase("stopped")
	b.met.ready.Set(0)
	// Stop following before closing the publishers, so nothing is emitted
	// into a closed publisher.
	for _, r := range b.ranks {
		r.sub.Close()
	}
	stop()
	wg.Wait()
	cctx, cancel := context.WithTimeout(context.Background(), b.cfg.DrainWait)
	defer cancel()
	return errors.Join(err, derr, b.closeRanks(cctx))
}

// waitForEngine polls /health and /metrics until both answer, saying so
// (readyz 503 and a log line every 10 attempts) meanwhile.
func (b *Bridge) waitForEngine(ctx context.Context) (scrape, error) {
	t := time.NewTicker(b.cfg.HealthInterval)
	defer t.Stop()
	for attempt := 0; ; attempt++ {
		err := b.eng.health(ctx)
		var s scrape
		if err == nil {
			s, err = b.eng.scrape(ctx)
		}
		if err == nil {
			return s, nil
		}
		if attempt%10 == 0 {
			b.log.Warn("engine not answering yet; waiting (not registered)", "err", err)
		}
		b.setPhase("waiting for the engine: " + err.Error())
		select {
		case <-ctx.Done():
			return scrape{}, ctx.Err()
		case <-t.C:
		}
	}
}

// configure settles the block size and capacity from the flags and the
// engine's cache configuration.
func (b *Bridge) configure(s scrape) error {
	bs := b.cfg.BlockSize
	switch {
	case bs != 0 && s.blockSize != 0 && bs != s.blockSize:
		return fmt.Errorf("%w: --block-size %d, but the engine's vllm:cache_config_info says %d", ErrBlockSize, bs, s.blockSize)
	case bs == 0 && s.blockSize == 0:
		return fmt.Errorf("%w: the engine at %s exports no vllm:cache_config_info block_size: give --block-size", ErrConfig, b.cfg.EngineURL)
	case bs == 0:
		bs = s.blockSize
	}
	if bs != b.cfg.RouterBlockSize {
		return fmt.Errorf("%w: engine block size %d, router block size %d (start the engine with --block-size %d or the routers with --block-size %d)",
			ErrBlockSize, bs, b.cfg.RouterBlockSize, b.cfg.RouterBlockSize, bs)
	}
	kv := b.cfg.KVBlocks
	if kv == 0 {
		kv = s.kvBlocks
	}
	if kv == 0 && s.capTokens > 0 {
		kv = s.capTokens / bs
	}
	if kv < 1 {
		return fmt.Errorf("%w: the engine at %s reports no capacity (num_gpu_blocks): give --kv-blocks", ErrConfig, b.cfg.EngineURL)
	}
	b.blockSize, b.kvBlocks = bs, kv
	return nil
}

func (b *Bridge) rankIDs() []uint32 {
	out := make([]uint32, len(b.ranks))
	for i, r := range b.ranks {
		out[i] = r.id
	}
	return out
}

// openRanks opens every rank's subscriber (first, so nothing published
// from now on is missed), converter and publisher.
func (b *Bridge) openRanks() error {
	for i := range b.cfg.DataParallelSize {
		events, replay, err := b.cfg.endpoints(i)
		if err != nil {
			return err
		}
		cc, pc := b.cfg.rankEvents(b.blockSize, uint32(i))
		conv, err := vllm.NewConverter(cc)
		if err != nil {
			return fmt.Errorf("bridge: rank %d: %w", i, err)
		}
		sub, err := vllmzmq.NewSubscriber(vllmzmq.SubscriberConfig{Endpoint: events, Topic: b.cfg.Topic, Logger: b.cfg.Logger})
		if err != nil {
			return fmt.Errorf("bridge: rank %d: %w", i, err)
		}
		pub, err := kvevents.NewPublisher(b.js, pc)
		if err != nil {
			sub.Close()
			return fmt.Errorf("bridge: rank %d: %w", i, err)
		}
		b.ranks = append(b.ranks, &rank{
			b: b, id: uint32(i), label: strconv.Itoa(i), replay: replay, sub: sub, pub: pub, conv: conv, conv0: cc,
			log: b.log.With("rank", i, "events", events),
		})
	}
	return nil
}

func (b *Bridge) closeRanks(ctx context.Context) error {
	var errs []error
	for _, r := range b.ranks {
		r.sub.Close()
		if err := r.pub.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// scrapeLoop scrapes /metrics every interval, publishes the load reports
// and re-evaluates the worker's state (a stale scrape makes it
// unavailable).
func (b *Bridge) scrapeLoop(ctx context.Context) {
	every(ctx, b.cfg.MetricsInterval, func() {
		s, err := b.eng.scrape(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			b.met.scrapeErrors.Inc()
			b.log.Debug("scrape failed", "err", err)
		} else {
			b.mu.Lock()
			b.lastScrape = s
			b.mu.Unlock()
			b.adapters.scraped(s.lora)
			for _, l := range s.loadReports(b.cfg.Model, b.cfg.WorkerID, len(b.ranks), b.kvBlocks) {
				if err := workers.PublishLoad(b.nc, b.cfg.Prefix, l); err != nil {
					b.log.Debug("load report not published", "err", err)
				}
			}
		}
		for _, r := range b.ranks {
			b.met.bufferEvents.WithLabelValues(r.label).Set(float64(r.pub.Stats().Unacked))
			b.met.malformed.WithLabelValues(r.label).Set(float64(r.sub.Malformed()))
		}
		b.syncAdapters(ctx)
		b.evaluate(ctx)
	})
}

// healthLoop checks GET /health every HealthInterval.
func (b *Bridge) healthLoop(ctx context.Context) {
	every(ctx, b.cfg.HealthInterval, func() {
		err := b.eng.health(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			b.refreshServed(ctx)
		}
		if b.recordHealth(err) {
			b.log.Warn("engine health check failing: worker unavailable", "err", err, "failed_checks", b.cfg.HealthFailures)
		}
		b.evaluate(ctx)
	})
}

// recordHealth folds one /health result in: the engine is unhealthy from
// HealthFailures consecutive failures on, healthy again at the first
// success. It reports whether this result made it unhealthy.
func (b *Bridge) recordHealth(err error) (lost bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.met.healthFailures.Inc()
		b.failedChecks++
	} else {
		b.failedChecks = 0
	}
	was := b.healthy
	b.healthy = b.failedChecks < b.cfg.HealthFailures
	return was && !b.healthy
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() == nil {
			f()
		}
	}
}

// evaluate writes the state the engine's health and load freshness call
// for: ready when /health answers and the last scrape is younger than
// StaleIntervals x MetricsInterval, unavailable otherwise. It never leaves
// draining.
func (b *Bridge) evaluate(ctx context.Context) {
	// Two loops evaluate; one at a time, so state writes keep their order.
	b.evalMu.Lock()
	defer b.evalMu.Unlock()
	b.mu.Lock()
	age := time.Since(b.lastScrape.at)
	want := workers.StateReady
	if !b.healthy || age > b.cfg.staleAfter() {
		want = workers.StateUnavailable
	}
	reg, cur, healthy := b.reg, b.state, b.healthy
	if b.draining || want == cur {
		b.mu.Unlock()
		b.met.scrapeAge.Set(age.Seconds())
		return
	}
	b.state = want
	b.mu.Unlock()
	b.met.scrapeAge.Set(age.Seconds())
	b.met.available.Set(boolGauge(want == workers.StateReady))
	b.log.Info("worker state", "state", want, "healthy", healthy, "scrape_age", age)
	if err := reg.SetState(ctx, want); err != nil && ctx.Err() == nil {
		b.log.Warn("state not written (the heartbeat retries)", "state", want, "err", err)
	}
}

func boolGauge(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// drain marks the worker draining, waits for the engine's requests in
// flight (from the scrapes, which go on meanwhile) and deregisters.
func (b *Bridge) drain(reg *workers.Registration) error {
	b.mu.Lock()
	b.draining, b.state = true, workers.StateDraining
	b.mu.Unlock()
	b.met.available.Set(0)
	b.log.Info("draining: state draining, waiting for the engine's requests, then deregistering")
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.DrainWait+5*time.Second)
	defer cancel()
	err := reg.Drain(ctx, workers.DrainConfig{MaxWait: b.cfg.DrainWait, InFlight: b.inFlight})
	if errors.Is(err, workers.ErrStopped) {
		return nil
	}
	return err
}

// inFlight is the engine's running plus waiting requests at the last
// scrape; 0 once the scrape is stale (the engine is gone: nothing to wait
// for).
func (b *Bridge) inFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if time.Since(b.lastScrape.at) > b.cfg.staleAfter() {
		return 0
	}
	n := 0
	for _, l := range b.lastScrape.ranks {
		n += int(l.running + l.waiting)
	}
	return n
}
