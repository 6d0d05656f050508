package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/progress"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// ErrConfig reports an unusable replay configuration.
var ErrConfig = errors.New("replay: invalid config")

// Config is one comparison run.
type Config struct {
	Workload *workload.Workload // not modified
	Policies []Policy           // default: every DefaultPolicies entry
	NewStack StackFactory       // the NATS path's stacks, when Paths is empty
	// Paths are the paths every policy runs over, in order (default: the
	// NATS path with NewStack). Every path replays the same trace with the
	// same arrival times and seed.
	Paths []PathConfig

	Model       string  // default "bench"
	Workers     int     // default 8
	KVBlocks    int     // per worker; default 1 Mi tokens' worth (Dynamo's mocker: 16,384 x 64)
	BlockSize   int     // default 512 for block-id workloads (one Mooncake block), else 16
	Replicas    int     // default 1
	Speedup     float64 // default 10: the workload runs 10x faster than real time
	SessionMode SessionMode
	Seed        uint64
	// Runs repeats the whole comparison this many times (default 1), run r
	// with seed Seed + r; every figure of the report is then the median
	// over the runs, with its spread (metrics.RunSpread).
	Runs int
	// LoadScale multiplies the workload's arrival rate (default 1).
	LoadScale float64
	// MaxInFlight bounds requests in flight; arrivals wait past it and the
	// wait counts in their latency (default 8,192).
	MaxInFlight int
	// RouteDeadline bounds a request's wait in a router queue (wall clock;
	// default: the replica's).
	RouteDeadline time.Duration
	// MaxBatchedTokens and MaxSeqs of each simulated worker (0 = sim defaults).
	MaxBatchedTokens int
	MaxSeqs          int
	// QueueThreshold: see StackConfig.QueueThreshold.
	QueueThreshold float64
	// MaxOutputTokens caps every request's output (0 = as the workload
	// says). Streaming output dominates the replay's own CPU cost; prefix
	// reuse and TTFT do not depend on it, decode load does.
	MaxOutputTokens int

	Title         string
	Progress      io.Writer // progress bar destination (nil = none)
	ProgressLines bool      // one line per 10 % instead of redrawing
	Logf          func(format string, args ...any)
}

func (c *Config) normalize() error {
	if c.Workload == nil || len(c.Workload.Requests) == 0 {
		return fmt.Errorf("%w: empty workload", ErrConfig)
	}
	if len(c.Paths) == 0 {
		if c.NewStack == nil {
			return fmt.Errorf("%w: no stack factory", ErrConfig)
		}
		c.Paths = []PathConfig{{Name: PathNATS, NewStack: c.NewStack}}
	}
	for _, p := range c.Paths {
		if p.NewStack == nil || p.Name == "" {
			return fmt.Errorf("%w: path %q without a name or stack factory", ErrConfig, p.Name)
		}
	}
	if len(c.Policies) == 0 {
		ps, err := LookupPolicies(DefaultPolicies)
		if err != nil {
			return err
		}
		c.Policies = ps
	}
	if c.Model == "" {
		c.Model = "bench"
	}
	if c.Workers == 0 {
		c.Workers = 8
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
		if c.Workload.BlockTokens > 0 {
			c.BlockSize = c.Workload.BlockTokens
		}
	}
	if c.KVBlocks == 0 {
		c.KVBlocks = max(2, (1<<20)/c.BlockSize)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Speedup == 0 {
		c.Speedup = 10
	}
	if c.SessionMode == "" {
		c.SessionMode = SessionNone
	}
	if c.LoadScale == 0 {
		c.LoadScale = 1
	}
	if c.Runs == 0 {
		c.Runs = 1
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 8192
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	switch {
	case c.Workers < 1 || c.Workers > 4096:
		return fmt.Errorf("%w: workers %d (want 1..4096)", ErrConfig, c.Workers)
	case c.Replicas < 1 || c.Replicas > 64:
		return fmt.Errorf("%w: replicas %d (want 1..64)", ErrConfig, c.Replicas)
	case c.BlockSize < 1:
		return fmt.Errorf("%w: block size %d", ErrConfig, c.BlockSize)
	case c.KVBlocks < 2:
		return fmt.Errorf("%w: kv blocks %d", ErrConfig, c.KVBlocks)
	case !(c.Speedup > 0) || c.Speedup > 1e6:
		return fmt.Errorf("%w: speedup %g (want > 0)", ErrConfig, c.Speedup)
	case !(c.LoadScale > 0) || c.LoadScale > 1e6:
		return fmt.Errorf("%w: load scale %g (want > 0)", ErrConfig, c.LoadScale)
	case c.MaxOutputTokens < 0:
		return fmt.Errorf("%w: max output tokens %d", ErrConfig, c.MaxOutputTokens)
	case c.Runs < 1 || c.Runs > 100:
		return fmt.Errorf("%w: runs %d (want 1..100)", ErrConfig, c.Runs)
	case c.MaxInFlight < 1:
		return fmt.Errorf("%w: max in flight %d", ErrConfig, c.MaxInFlight)
	}
	if _, err := ParseSessionMode(string(c.SessionMode)); err != nil {
		return err
	}
	if c.Workload.BlockTokens > 0 && c.Workload.BlockTokens%c.BlockSize != 0 && c.BlockSize%c.Workload.BlockTokens != 0 {
		return fmt.Errorf("%w: block size %d does not divide the trace's %d-token blocks", ErrConfig, c.BlockSize, c.Workload.BlockTokens)
	}
	return nil
}

// Run replays the workload once per policy, each on a fresh stack, and
// returns the comparison. A policy whose stack cannot be built fails the run;
// requests that fail are counted, not fatal.
func Run(ctx context.Context, cfg Config) (*report.Report, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	w := cfg.Workload
	if cfg.LoadScale != 1 {
		scaled := *w
		scaled.Requests = append([]workload.Request(nil), w.Requests...)
		if err := scaled.ScaleLoad(cfg.LoadScale); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		w = &scaled
	}
	reqs := prepare(w, cfg.BlockSize, cfg.MaxOutputTokens)
	bound := w.UpperBound(cfg.BlockSize)
	rep := &report.Report{
		Version: report.Version,
		Title:   cfg.Title,
		Created: time.Now(),
		Workload: report.Workload{
			Name: w.Name, Stats: w.Stats(), LoadScale: cfg.LoadScale, UpperBound: bound,
		},
		Setup: report.Setup{
			Workers: cfg.Workers, Replicas: cfg.Replicas, KVBlocks: cfg.KVBlocks, BlockSize: cfg.BlockSize,
			Speedup: cfg.Speedup, SessionMode: string(cfg.SessionMode), Seed: cfg.Seed, GoVersion: runtime.Version(), Runs: cfg.Runs,
		},
	}
	if w.BlockTokens > 0 {
		tb := w.TraceBound()
		rep.Workload.TraceBound = &tb
	}
	unl := UnloadedTTFT(w, cfg.BlockSize, cfg.MaxBatchedTokens)
	rep.Unloaded = &unl
	type rowKey struct{ path, policy string }
	var order []rowKey
	runs := map[rowKey][]metrics.Summary{}
	seed := cfg.Seed
	for run := range cfg.Runs {
		cfg.Seed = seed + uint64(run)
		for _, path := range cfg.Paths {
			if run == 0 {
				rep.Setup.Paths = append(rep.Setup.Paths, path.Name)
			}
			for _, pol := range cfg.Policies {
				if err := ctx.Err(); err != nil {
					return rep, err
				}
				if pol.Oracle && path.NoOracle {
					if run == 0 {
						rep.Notes = append(rep.Notes, fmt.Sprintf("%s did not run over the %s path: the path cannot carry its choice.", pol.Name, path.Name))
					}
					continue
				}
				s, err := runPolicy(ctx, &cfg, path, pol, reqs, bound.Ratio)
				if err != nil {
					return rep, fmt.Errorf("replay: policy %s over %s: %w", pol.Name, path.Name, err)
				}
				k := rowKey{path.Name, pol.Name}
				if run == 0 {
					order = append(order, k)
				}
				runs[k] = append(runs[k], s)
				cfg.Logf("run %d/%d %s (%s): %d done, %d rejected, %d failed, hit %.1f%%, TTFT p50 %.0f ms p99 %.0f ms, wall %.1fs",
					run+1, cfg.Runs, s.Policy, s.Path, s.Done, s.Rejected, s.Failed, 100*s.HitRatio, s.TTFT.P50, s.TTFT.P99, s.WallSeconds)
			}
		}
	}
	cfg.Seed = seed
	for _, k := range order {
		rep.Policies = append(rep.Policies, medianOfRuns(runs[k]))
	}
	if cfg.Runs > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Every figure is the median of %d runs (seeds %d..%d); the charts show the run with the median TTFT p99.", cfg.Runs, seed, seed+uint64(cfg.Runs)-1))
	}
	rep.Checks = Checks(rep)
	rep.Notes = append(rep.Notes, policyNotes(&cfg)...)
	switch {
	case cfg.QueueThreshold < 0:
		rep.Notes = append(rep.Notes, "Router-side queueing was off: every request went to a worker at once and waited there.")
	case cfg.QueueThreshold > 0:
		rep.Notes = append(rep.Notes, fmt.Sprintf("Router queue threshold %g: a worker counts as busy from %g x its max batched tokens of booked prefill (or that fraction of its KV blocks); the peers run with their own admission instead.", cfg.QueueThreshold, cfg.QueueThreshold))
	}
	if cfg.MaxOutputTokens > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Output lengths were capped at %d tokens.", cfg.MaxOutputTokens))
	}
	if cfg.SessionMode == SessionNone {
		rep.Notes = append(rep.Notes, "Session ids were not sent (session mode none).")
	} else {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Session ids were sent with %s bindings; the oracle sends none (it names its own worker as a Soft preference), and each peer uses its own session affinity (above).", cfg.SessionMode))
	}
	return rep, nil
}

// policyNotes says what each policy is and how each peer ran.
func policyNotes(cfg *Config) []string {
	var notes []string
	for _, p := range cfg.Policies {
		notes = append(notes, fmt.Sprintf("%s: %s.", p.Name, p.About))
		if op, ok := peerOperation(p); ok {
			sc, _ := stackConfig(cfg, p)
			admission := "no router queue"
			if sc.QueueThreshold > 0 {
				admission = fmt.Sprintf("router queue threshold %g", sc.QueueThreshold)
			}
			notes = append(notes, fmt.Sprintf("%s ran as its authors run it: %s, sessions %s (%s).", p.Name, admission, sc.SessionMode, op.Source))
		}
	}
	return notes
}

// peerOperation is the peer's own admission and session affinity
// (scheduler.Registry.Operation); false for kvrouter's policies.
func peerOperation(pol Policy) (scheduler.Operation, bool) {
	if !pol.Peer {
		return scheduler.Operation{}, false
	}
	return scheduler.NewRegistry().Operation(pol.RouterPolicy)
}

// stackConfig is the stack pol runs on. kvrouter's policies run with the
// run's queue threshold and session mode; a peer runs as its authors run
// it (peerOperation): its default admission instead of the run's threshold
// (none of the peers queues in the router: −1), and, when the run sends
// session ids, its own session affinity in place of the run's binding mode
// (none: its requests carry no session id).
func stackConfig(cfg *Config, pol Policy) (StackConfig, error) {
	sc := StackConfig{
		Policy: pol, Model: cfg.Model, Workers: cfg.Workers, KVBlocks: cfg.KVBlocks, BlockSize: cfg.BlockSize,
		Replicas: cfg.Replicas, Speedup: cfg.Speedup, SessionMode: cfg.SessionMode, Seed: cfg.Seed, Probe: pol.Oracle,
		MaxBatchedTokens: cfg.MaxBatchedTokens, MaxSeqs: cfg.MaxSeqs, RouteDeadline: cfg.RouteDeadline,
		QueueThreshold: cfg.QueueThreshold,
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
	if cfg.SessionMode == SessionNone || op.SessionMode == "" {
		sc.SessionMode = SessionNone
		return sc, nil
	}
	m, err := ParseSessionMode(op.SessionMode)
	sc.SessionMode = m
	return sc, err
}

// runPolicy replays every request against a fresh stack.
func runPolicy(ctx context.Context, cfg *Config, path PathConfig, pol Policy, reqs []prepared, bound float64) (metrics.Summary, error) {
	sc, err := stackConfig(cfg, pol)
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
	d := &driver{cfg: cfg, pol: pol, sessions: sc.SessionMode, router: stack.Router(), gen: stack.Generator(), rec: metrics.NewRecorder(len(reqs))}
	if fs, ok := stack.(FrontendStack); ok {
		d.front = fs.Frontend()
	}
	if pol.Oracle && d.front != nil {
		return metrics.Summary{}, fmt.Errorf("%w: the oracle cannot run over a frontend", ErrConfig)
	}
	if pol.Oracle {
		probe := stack.Probe()
		if probe == nil {
			return metrics.Summary{}, fmt.Errorf("%w: the stack has no cache probe for the oracle", ErrConfig)
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
		d.oracle = newOracle(probe, stack.Loads(), stack.Workers(), cfg.BlockSize, cfg.Seed, bp, bd)
	}
	if cfg.Progress != nil {
		d.bar = progress.New(cfg.Progress, pol.Name, len(reqs), progress.Options{Lines: cfg.ProgressLines})
	}
	start := time.Now()
	sem := make(chan struct{}, cfg.MaxInFlight)
	var wg sync.WaitGroup
	for i := range reqs {
		p := &reqs[i]
		due := start.Add(time.Duration(float64(p.req.Arrival) / cfg.Speedup))
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
	d.bar.Finish()
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
	sum := metrics.Summarize(d.rec.Records(), metrics.Options{
		Policy: pol.Name, UpperBound: bound, BlockSize: cfg.BlockSize, Workers: stack.Workers(), Wall: time.Since(start),
	})
	sum.Path = path.Name
	sum.Diagnostics = diag
	return sum, nil
}

type driver struct {
	cfg      *Config
	pol      Policy
	sessions SessionMode // the run's, or a peer's own (stackConfig)
	router   Router
	gen      Generator
	front    Frontend // the gateway path: route, serve and book in one call
	oracle   *oracle
	rec      *metrics.Recorder
	bar      *progress.Bar
}

// one is one request's life: route, generate, prefill_done, free.
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
		InputTokens: r.InputLength, ExpectedOutput: p.outputTokens, RoutingKey: r.Session,
	}
	if d.sessions != SessionNone && r.Session != "" && !d.pol.Oracle {
		rr.SessionID = r.Session
	}
	var bk *booking
	if d.oracle != nil {
		bk = d.oracle.pick(ctx, p)
		rr.Prefer = bk.worker
		defer d.oracle.free(bk)
	}
	t0 := time.Now()
	routed, err := d.router.Route(ctx, &rr)
	rec.Route = time.Since(t0)
	if err != nil {
		rec.Outcome, rec.Code = classify(err)
		d.finish(rec)
		return
	}
	rec.Worker = routed.Worker
	rec.QueueWait = routed.QueueWait
	rec.RouterBlocks = routed.Overlap
	var once sync.Once
	first := func() {
		once.Do(func() {
			if bk != nil {
				d.oracle.prefillDone(bk)
			}
			if err := d.router.PrefillDone(ctx, routed); err != nil && ctx.Err() == nil {
				cfg.Logf("%s: prefill_done %s: %v", d.pol.Name, rr.ID, err)
			}
		})
	}
	reply, gerr := d.gen.Generate(ctx, routed.Endpoint, p.generateRequest(rr.ID, d.blockTokens()), first)
	first() // a request that failed before its first token still leaves the prefill load
	if err := d.router.Free(ctx, routed); err != nil && ctx.Err() == nil {
		cfg.Logf("%s: free %s: %v", d.pol.Name, rr.ID, err)
	}
	if gerr != nil {
		rec.Outcome = metrics.Failed
		rec.Code = "generate"
		var re *sim.RemoteError
		if errors.As(gerr, &re) {
			rec.Code = "worker_" + re.Code
		}
		d.finish(rec)
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

// UnloadedTTFT is the time to first token each request would see alone on an
// idle worker with a cold cache, from the simulator's timing model (chunked
// prefill at maxBatched tokens per step): the reference against which
// "loaded" is judged.
func UnloadedTTFT(w *workload.Workload, blockSize, maxBatched int) metrics.Dist {
	if maxBatched <= 0 {
		maxBatched = sim.DefaultMaxBatchedTokens
	}
	tm := sim.DefaultTiming()
	recs := make([]metrics.Record, len(w.Requests))
	for i := range w.Requests {
		left := w.Requests[i].InputLength
		var ms float64
		for left > 0 {
			chunk := min(left, maxBatched)
			ms += tm.PrefillMs(chunk)
			left -= chunk
		}
		recs[i] = metrics.Record{TTFT: msDur(ms), E2E: msDur(ms)}
	}
	return metrics.Summarize(recs, metrics.Options{}).TTFT
}

// Checks evaluates the targets that this run can show: kvrouter
// against round-robin and the oracle, and whether the load was high enough
// for the latency targets to mean anything.
func Checks(r *report.Report) []report.Check {
	var out []report.Check
	kv, rr, or := r.Policy("kvrouter"), r.Policy("round-robin"), r.Policy("oracle")
	if rr != nil && r.Unloaded != nil && r.Unloaded.P99 > 0 {
		x := rr.TTFT.P99 / r.Unloaded.P99
		out = append(out, report.Check{Name: "load: round-robin p99 TTFT vs unloaded p99", Want: "≥ 10x", Got: fmt.Sprintf("%.1fx (%.0f / %.0f ms)", x, rr.TTFT.P99, r.Unloaded.P99), Pass: x >= 10})
	}
	if kv != nil && rr != nil && kv.TTFT.P99 > 0 && kv.TTFT.P50 > 0 {
		x99, x50 := rr.TTFT.P99/kv.TTFT.P99, rr.TTFT.P50/kv.TTFT.P50
		out = append(out,
			report.Check{Name: "kvrouter p99 TTFT lower than round-robin's", Want: "≥ 5x", Got: fmt.Sprintf("%.1fx (%.0f vs %.0f ms)", x99, kv.TTFT.P99, rr.TTFT.P99), Pass: x99 >= 5},
			report.Check{Name: "kvrouter p50 TTFT lower than round-robin's", Want: "≥ 2x", Got: fmt.Sprintf("%.1fx (%.0f vs %.0f ms)", x50, kv.TTFT.P50, rr.TTFT.P50), Pass: x50 >= 2},
		)
	}
	if kv != nil && or != nil && or.HitRatio > 0 {
		x := kv.HitRatio / or.HitRatio
		out = append(out, report.Check{Name: "kvrouter hit ratio vs oracle's", Want: "≥ 95 %", Got: fmt.Sprintf("%.1f %% (%.1f %% vs %.1f %%)", 100*x, 100*kv.HitRatio, 100*or.HitRatio), Pass: x >= 0.95})
	}
	out = append(out, peerChecks(r, kv)...)
	if kv != nil && r.Setup.SessionMode == string(SessionHard) {
		out = append(out, report.Check{Name: "Hard sessions never move while their worker is alive", Want: "0 moved", Got: fmt.Sprintf("%d of %d", kv.SessionsMoved, kv.Sessions), Pass: kv.SessionsMoved == 0})
	}
	return out
}

// peerChecks are issue 17's targets against the peers' algorithms, on
// kvrouter's first path: the lowest TTFT p50 and p99 of every policy but the
// oracle, and a p99 at least 1.2x lower than the best peer's.
func peerChecks(r *report.Report, kv *metrics.Summary) []report.Check {
	if kv == nil {
		return nil
	}
	peer := map[string]bool{}
	for _, n := range PeerPolicies {
		peer[n] = true
	}
	var best *metrics.Summary
	lowest50, lowest99 := true, true
	var beat50, beat99 []string
	for i := range r.Policies {
		p := &r.Policies[i]
		if p.Path != kv.Path || p.Policy == kv.Policy || p.Policy == "oracle" || p.Done == 0 {
			continue
		}
		if p.TTFT.P50 < kv.TTFT.P50 {
			lowest50 = false
			beat50 = append(beat50, p.Policy)
		}
		if p.TTFT.P99 < kv.TTFT.P99 {
			lowest99 = false
			beat99 = append(beat99, p.Policy)
		}
		if peer[p.Policy] && (best == nil || p.TTFT.P99 < best.TTFT.P99) {
			best = p
		}
	}
	lower := func(names []string) string {
		if len(names) == 0 {
			return "lowest"
		}
		return "beaten by " + strings.Join(names, ", ")
	}
	out := []report.Check{
		{Name: "kvrouter lowest TTFT p50 except the oracle", Want: "lowest", Got: fmt.Sprintf("%s (%.0f ms)", lower(beat50), kv.TTFT.P50), Pass: lowest50},
		{Name: "kvrouter lowest TTFT p99 except the oracle", Want: "lowest", Got: fmt.Sprintf("%s (%.0f ms)", lower(beat99), kv.TTFT.P99), Pass: lowest99},
	}
	if best != nil && kv.TTFT.P99 > 0 {
		x := best.TTFT.P99 / kv.TTFT.P99
		out = append(out, report.Check{Name: "kvrouter p99 TTFT lower than the best peer's", Want: "≥ 1.2x",
			Got: fmt.Sprintf("%.2fx (%.0f vs %s %.0f ms)", x, kv.TTFT.P99, best.Policy, best.TTFT.P99), Pass: x >= 1.2})
	}
	return out
}

// PolicyNames joins the names of policies.
func PolicyNames(ps []Policy) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}
