package replay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/progress"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// runPolicy replays every request against a fresh stack.
func runPolicy(ctx context.Context, cfg *Config, path PathConfig, pol Policy, reqs []prepared, bound float64) (metrics.Summary, error) {
	sc, err := cfg.stackConfig(pol)
	if err != nil {
		return metrics.Summary{}, err
	}
	stack, err := path.NewStack(ctx, sc)
	if err != nil {
		return metrics.Summary{}, fmt.Errorf("build stack: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := stack.Close(cctx); err != nil {
			cfg.Logf("%s: closing stack: %v", pol.Name, err)
		}
	}()
	d, err := newDriver(cfg, pol, sc.SessionMode, stack, len(reqs))
	if err != nil {
		return metrics.Summary{}, err
	}
	shareLow := sampleCachedShare(stack)
	start := time.Now()
	d.replay(ctx, reqs, start)
	d.bar.Finish()
	lowest := shareLow()
	if err := ctx.Err(); err != nil {
		return metrics.Summary{}, err
	}
	var diag []string
	if dg, ok := stack.(Diagnoser); ok {
		for _, line := range dg.Diagnostics() {
			cfg.Logf("%s (%s, seed %d): %s", pol.Name, path.Name, cfg.Seed, line)
			diag = append(diag, fmt.Sprintf("seed %d: %s", cfg.Seed, line))
		}
	}
	recs := d.rec.Records()
	if err := writeRecords(cfg.Records, path.Name, pol.Name, cfg.Seed, recs); err != nil {
		return metrics.Summary{}, err
	}
	sum := metrics.Summarize(recs, metrics.Options{
		Policy: pol.Name, UpperBound: bound, BlockSize: cfg.BlockSize, Workers: stack.Workers(), Wall: time.Since(start), PD: pol.PD,
	})
	sum.Path = path.Name
	sum.Diagnostics = diag
	sum.CachedShareLow = lowest
	return sum, nil
}

// shareSampleEvery is how often a run samples its routers' cached-share
// estimate: about one routing decision apart at the replays' rates, and the
// estimate moves by about 1/256 per decision.
const shareSampleEvery = 20 * time.Millisecond

// sampleCachedShare samples stack's cached-share estimates (ShareProber)
// until the returned stop is called, which returns the lowest value seen,
// or nil when the stack reports none.
func sampleCachedShare(stack Stack) (stop func() *float64) {
	sp, ok := stack.(ShareProber)
	if !ok {
		return func() *float64 { return nil }
	}
	low := math.Inf(1)
	observe := func() {
		for _, v := range sp.CachedShares() {
			low = min(low, v)
		}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(shareSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				observe()
			}
		}
	}()
	return func() *float64 {
		close(done)
		<-finished
		observe()
		if math.IsInf(low, 1) {
			return nil
		}
		return &low
	}
}

// peerOperation is the peer's own admission and session affinity
// (scheduler.Registry.Operation); false for kvrouter's policies.
func peerOperation(pol Policy) (scheduler.Operation, bool) {
	if !pol.Peer {
		return scheduler.Operation{}, false
	}
	return scheduler.NewRegistry().Operation(pol.RouterPolicy)
}

// stackConfig is what a stack for pol is built from. kvrouter's policies
// run with the run's queue threshold and session mode; a peer runs as its
// authors run it (peerOperation): its default admission instead of the
// run's threshold (none of the peers queues in the router: −1), and, when
// the run sends session ids, its own session affinity in place of the run's
// binding mode (none: its requests carry no session id), and its own
// predict-on-route unless the policy names a TTL.
func (c *Config) stackConfig(pol Policy) (StackConfig, error) {
	sc := StackConfig{
		Policy: pol, Model: c.Model, Workers: c.Workers, KVBlocks: c.KVBlocks, BlockSize: c.BlockSize,
		Replicas: c.Replicas, Speedup: c.Speedup, SessionMode: c.SessionMode, Seed: c.Seed, Probe: pol.TrueCache,
		MaxBatchedTokens: c.MaxBatchedTokens, MaxSeqs: c.MaxSeqs, RouteDeadline: c.RouteDeadline,
		QueueThreshold: c.QueueThreshold,
	}
	if pol.PD {
		sc.Fleet, sc.Transfer = c.Fleet, c.transferModel()
	}
	if pol.NoRouterQueue {
		sc.QueueThreshold = -1
	}
	op, ok := peerOperation(pol)
	if !ok {
		return sc, nil
	}
	switch t := op.Thresholds; {
	case t == (scheduler.Thresholds{}):
		sc.QueueThreshold = -1
	case t.OverloadPrefillFrac == 0 && t.OverloadDecodeFrac == 0 && t.QueuePrefillFrac == t.QueueDecodeFrac:
		sc.QueueThreshold = t.QueuePrefillFrac
	default:
		return sc, fmt.Errorf("%w: %s's admission %+v is not one queue threshold", ErrConfig, pol.Name, t)
	}
	if sc.Policy.PredictedTTL == 0 {
		sc.Policy.PredictedTTL = op.PredictOnRoute
		if op.PredictOnRoute == 0 {
			sc.Policy.PredictedTTL = -1 // off
		}
	}
	if c.SessionMode == SessionNone || op.SessionMode == "" {
		sc.SessionMode = SessionNone
		return sc, nil
	}
	m, err := ParseSessionMode(op.SessionMode)
	sc.SessionMode = m
	return sc, err
}

type driver struct {
	cfg      *Config
	pol      Policy
	sessions SessionMode // the run's, or a peer's own (stackConfig)
	router   Router
	gen      Generator
	front    Frontend   // the gateway path: route, serve and book in one call
	truth    *trueCache // the true-cache policy's chooser, nil for the others
	rec      *metrics.Recorder
	bar      *progress.Bar
}

func newDriver(cfg *Config, pol Policy, sessions SessionMode, stack Stack, n int) (*driver, error) {
	d := &driver{cfg: cfg, pol: pol, sessions: sessions, router: stack.Router(), gen: stack.Generator(), rec: metrics.NewRecorder(n)}
	if fs, ok := stack.(FrontendStack); ok {
		d.front = fs.Frontend()
	}
	if (pol.TrueCache || pol.PD) && d.front != nil {
		return nil, fmt.Errorf("%w: %s cannot run over a frontend", ErrConfig, pol.Name)
	}
	if pol.TrueCache {
		probe := stack.Probe()
		if probe == nil {
			return nil, fmt.Errorf("%w: the stack has no cache probe for true-cache", ErrConfig)
		}
		th := cfg.QueueThreshold
		if th == 0 {
			th = 1 // the scheduler's default
		}
		var bp, bd float64
		if th > 0 {
			mbt := cfg.MaxBatchedTokens
			if mbt <= 0 {
				mbt = sim.DefaultMaxBatchedTokens
			}
			bp, bd = th*float64(mbt), th*float64(cfg.KVBlocks)
		}
		d.truth = newTrueCache(probe, stack.Loads(), stack.Workers(), cfg.BlockSize, cfg.Seed, bp, bd)
	}
	if cfg.Progress != nil {
		d.bar = progress.New(cfg.Progress, pol.Name, n, progress.Options{Lines: cfg.ProgressLines})
	}
	return d, nil
}

// replay sends each request at its arrival (workload time / speed-up after
// start), at most MaxInFlight at once, and waits for all of them.
func (d *driver) replay(ctx context.Context, reqs []prepared, start time.Time) {
	sem := make(chan struct{}, d.cfg.MaxInFlight)
	var wg sync.WaitGroup
	for i := range reqs {
		p := &reqs[i]
		due := start.Add(time.Duration(float64(p.req.Arrival) / d.cfg.Speedup))
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if d.front != nil {
				d.oneFrontend(ctx, p)
				return
			}
			d.one(ctx, p)
		}()
	}
	wg.Wait()
}

// one is one request's life: route, generate, prefill_done, free. The route
// API learns the prompt and max_tokens, as from a client; only the engine
// is told the reply's true length.
func (d *driver) one(ctx context.Context, p *prepared) {
	cfg := d.cfg
	r := p.req
	rec := metrics.Record{ID: r.ID, Session: r.Session, Arrival: r.Arrival, PromptTokens: r.InputLength, PromptBlocks: p.promptBlocks}
	// The routing key stands for the first user message, which KubeAI's
	// prefix hash keys a chat request on: the same for every turn of a
	// conversation, different between conversations. The workloads carry
	// no text, so the conversation's id stands in for it, sent whatever
	// the session mode (it is content, not a session header); a request of
	// no conversation has none, and chwbl keys its prompt's opening.
	rr := RouteRequest{
		ID: r.ID, Model: cfg.Model, BlockHashes: p.blockHashes, BlockSize: cfg.BlockSize,
		InputTokens: r.InputLength, ExpectedOutput: p.maxTokens, RoutingKey: r.Session, PD: d.pol.PD,
	}
	if d.sessions != SessionNone && r.Session != "" && !d.pol.TrueCache {
		rr.SessionID = r.Session
	}
	var bk *booking
	if d.truth != nil {
		bk = d.truth.pick(ctx, p)
		rr.Prefer = bk.worker
		defer d.truth.free(bk)
	}
	t0 := time.Now()
	routed, err := d.router.Route(ctx, &rr)
	rec.Route = time.Since(t0)
	if err != nil {
		rec.Outcome, rec.Code = classify(err)
		d.logFailure(ctx, &rec, rr.ID, err)
		d.finish(rec)
		return
	}
	rec.Worker = routed.Worker
	rec.QueueWait = routed.QueueWait
	rec.RouterBlocks = routed.Overlap
	if routed.Prefill != nil {
		d.split(ctx, p, rr.ID, routed, &rec)
		return
	}
	reply, gerr := d.gen.Generate(ctx, routed.Endpoint, p.generateRequest(rr.ID, d.blockTokens()), d.firstToken(ctx, rr.ID, routed, bk))
	d.free(ctx, rr.ID, routed)
	if gerr != nil {
		d.generateFailed(ctx, rr.ID, nil, &rec, gerr, "")
		return
	}
	// Workload time = time queued in the router (scaled by the speed-up) +
	// the engine's own model-time figures. The in-process transport and the
	// CPU the replay itself needs are left out: at a speed-up they would be
	// multiplied into the latencies, and they are not part of what a
	// routing policy does.
	wait := time.Duration(float64(routed.QueueWait) * cfg.Speedup)
	rec.CachedBlocks = reply.CachedTokens / cfg.BlockSize
	rec.OutputTokens = reply.OutputTokens
	rec.TTFT = wait + msDur(reply.TTFTMs)
	rec.ITL = msDur(reply.ITLMs)
	rec.E2E = wait + msDur(reply.E2EMs)
	rec.Finish = r.Arrival + rec.E2E
	d.finish(rec)
}

// firstToken is the callback of a request's first token: prefill_done on
// its booking (and true-cache's, bk, when not nil), once. A request that
// failed before its first token still leaves the prefill load: free
// releases it all.
func (d *driver) firstToken(ctx context.Context, id string, routed *Routed, bk *booking) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			if bk != nil {
				d.truth.prefillDone(bk)
			}
			if err := d.router.PrefillDone(ctx, routed); err != nil && ctx.Err() == nil {
				d.cfg.Logf("%s: prefill_done %s: %v", d.pol.Name, id, err)
			}
		})
	}
}

// free releases a booking.
func (d *driver) free(ctx context.Context, id string, routed *Routed) {
	if err := d.router.Free(ctx, routed); err != nil && ctx.Err() == nil {
		d.cfg.Logf("%s: free %s: %v", d.pol.Name, id, err)
	}
}

func (d *driver) blockTokens() int {
	if d.cfg.Workload.BlockTokens > 0 {
		return d.cfg.Workload.BlockTokens
	}
	return 0
}

func (d *driver) finish(rec metrics.Record) {
	d.rec.Add(rec)
	failed := 0
	if rec.Outcome != metrics.Done {
		failed = 1
	}
	d.bar.Add(1, failed)
}

// logFailure logs why a request failed: a rejection is the load's answer,
// a failure a fault the report can only count by code.
func (d *driver) logFailure(ctx context.Context, rec *metrics.Record, id string, err error) {
	if rec.Outcome == metrics.Failed && ctx.Err() == nil {
		d.cfg.Logf("%s: request %s failed: %v", d.pol.Name, id, err)
	}
}

func classify(err error) (metrics.Outcome, string) {
	var re *RouteError
	if errors.As(err, &re) {
		if re.Rejected {
			return metrics.Rejected, re.Code
		}
		return metrics.Failed, re.Code
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return metrics.Failed, "cancelled"
	}
	return metrics.Failed, "route_error"
}

func msDur(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
