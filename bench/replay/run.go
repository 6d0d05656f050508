package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/workload"
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

	Model   string // default "bench"
	Workers int    // default 8, or the split fleet's size
	// Fleet splits the workers for the PD policies (pd.go); the others
	// run on an aggregated fleet of the same size. Zero = aggregated.
	Fleet Fleet
	// TransferGBps is the decode engines' KV transfer bandwidth in GB/s
	// of model time (0 = sim.DefaultTransferGBps).
	TransferGBps float64
	KVBlocks     int     // per worker; default 1 Mi tokens' worth (Dynamo's mocker: 16,384 x 64)
	BlockSize    int     // default 512 for block-id workloads (one Mooncake block), else 16
	Replicas     int     // default 1
	Speedup      float64 // default 10: the workload runs 10x faster than real time
	SessionMode  SessionMode
	Seed         uint64
	// Runs repeats the whole comparison this many times (default 1), run r
	// with seed Seed + r; every figure of the report is then the median
	// over the runs, with its spread (metrics.RunSpread).
	Runs int
	// Samples, when set, holds one workload per run (len == Runs, Samples[0]
	// == Workload): run r replays Samples[r], so the medians and the pooled
	// TTFT are over workload samples, not over one sample's timing (issue
	// 24's tuning rounds). The report's header describes Samples[0]; each
	// run's hit ratio is measured against its own sample's bound.
	Samples []*workload.Workload
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
	// MaxTokens is the max_tokens every client sends (0 = the workload's,
	// Workload.ClientMaxTokens): all that routers and bookings learn of a
	// reply's length. Engines generate each request's own output length,
	// at most this.
	MaxTokens int
	// Part is the held-out part the workload is (nil = not a declared part:
	// no held-out rule applies, and the report says so). On an evaluation
	// part a policy tuned on it (TunedOn) is refused with ErrInSample...
	Part *workload.PartInfo
	// ...unless AllowInSample: it then runs, its rows marked IN-SAMPLE.
	AllowInSample bool

	// Records, when not nil, receives every request's record of every
	// run as one JSON line (metrics.RecordLine): the per-request data behind the
	// report's distributions, for analysis the report does not make.
	Records io.Writer

	Title         string
	Progress      io.Writer // progress bar destination (nil = none)
	ProgressLines bool      // one line per 10 % instead of redrawing
	Logf          func(format string, args ...any)

	inSample map[string][]Tuning // set by normalize: policies tuned on Part
}

func (c *Config) normalize() error {
	if c.Workload == nil || len(c.Workload.Requests) == 0 {
		return fmt.Errorf("%w: empty workload", ErrConfig)
	}
	if err := c.normalizePaths(); err != nil {
		return err
	}
	if len(c.Policies) == 0 {
		names := DefaultPolicies
		if c.Fleet.Split() {
			names = PDPolicies
		}
		ps, err := LookupPolicies(names)
		if err != nil {
			return err
		}
		c.Policies = ps
	}
	c.applyDefaults()
	if err := c.validate(); err != nil {
		return err
	}
	return c.checkHeldOut()
}

func (c *Config) normalizePaths() error {
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
	return nil
}

// applyDefaults fills every zero field with its documented default.
func (c *Config) applyDefaults() {
	if c.Model == "" {
		c.Model = "bench"
	}
	if c.Workers == 0 {
		c.Workers = 8
		if c.Fleet.Split() {
			c.Workers = c.Fleet.Prefill + c.Fleet.Decode
		}
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
	if c.MaxTokens == 0 {
		c.MaxTokens = c.Workload.ClientMaxTokens()
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

func (c *Config) validate() error {
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
	case c.MaxTokens < 1:
		return fmt.Errorf("%w: max_tokens %d (want >= 1)", ErrConfig, c.MaxTokens)
	case c.Runs < 1 || c.Runs > 100:
		return fmt.Errorf("%w: runs %d (want 1..100)", ErrConfig, c.Runs)
	case len(c.Samples) > 0 && (len(c.Samples) != c.Runs || c.Samples[0] != c.Workload):
		return fmt.Errorf("%w: %d samples for %d runs (want one per run, the first the workload)", ErrConfig, len(c.Samples), c.Runs)
	case c.MaxInFlight < 1:
		return fmt.Errorf("%w: max in flight %d", ErrConfig, c.MaxInFlight)
	}
	if _, err := ParseSessionMode(string(c.SessionMode)); err != nil {
		return err
	}
	if err := c.checkPD(); err != nil {
		return err
	}
	for r, w := range c.Samples {
		if w == nil || len(w.Requests) == 0 || w.BlockTokens != c.Workload.BlockTokens {
			return fmt.Errorf("%w: sample %d is empty or has other blocks than the workload's", ErrConfig, r)
		}
	}
	if c.Workload.BlockTokens > 0 && c.Workload.BlockTokens%c.BlockSize != 0 && c.BlockSize%c.Workload.BlockTokens != 0 {
		return fmt.Errorf("%w: block size %d does not divide the trace's %d-token blocks", ErrConfig, c.BlockSize, c.Workload.BlockTokens)
	}
	return nil
}

// Run replays the workload once per policy, each on a fresh stack, and
// returns the comparison. A policy whose stack cannot be built fails the run;
// requests that fail are counted, not fatal. On an evaluation part a policy
// tuned on it fails the run with ErrInSample unless AllowInSample.
func Run(ctx context.Context, cfg Config) (*report.Report, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	w, err := cfg.scaledWorkload()
	if err != nil {
		return nil, err
	}
	rep := cfg.newReport(w)
	inputs, err := cfg.runInputs(w, rep.Workload.UpperBound.Ratio)
	if err != nil {
		return nil, err
	}
	rows, err := cfg.runAll(ctx, rep, inputs)
	if err != nil {
		return rep, err
	}
	for _, row := range rows {
		s := medianOfRuns(row)
		s.InSample = cfg.inSample[s.Policy] != nil
		rep.Policies = append(rep.Policies, s)
	}
	switch {
	case len(cfg.Samples) > 1:
		rep.Notes = append(rep.Notes, fmt.Sprintf("Every figure is the median of %d runs, each on its own workload sample (the header describes the first; the routers' and engines' seeds %d..%d); the charts show the run with the median TTFT p99.", cfg.Runs, cfg.Seed, cfg.Seed+uint64(cfg.Runs)-1))
	case cfg.Runs > 1:
		rep.Notes = append(rep.Notes, fmt.Sprintf("Every figure is the median of %d runs of the same requests (the routers' and engines' seeds %d..%d; the workload is the one sample named above); the charts show the run with the median TTFT p99.", cfg.Runs, cfg.Seed, cfg.Seed+uint64(cfg.Runs)-1))
	}
	rep.Checks = Checks(rep)
	rep.Notes = append(rep.Notes, cfg.notes(rep)...)
	return rep, nil
}

// Describe returns the report's header for cfg without running anything:
// the workload's shape, bounds, part, max_tokens and unloaded reference,
// with the held-out note (a policy tuned on the part is named, not refused).
func Describe(cfg Config) (*report.Report, error) {
	cfg.AllowInSample = true
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	w, err := cfg.scaledWorkload()
	if err != nil {
		return nil, err
	}
	rep := cfg.newReport(w)
	rep.Notes = append(rep.Notes, cfg.partNote())
	return rep, nil
}

// runInput is what one run replays: the prepared requests and their
// infinite-cache bound.
type runInput struct {
	reqs  []prepared
	bound float64
}

// runInputs prepares each run's requests: w (the scaled Workload, whose
// bound is bound) for every run, or with Samples, each run its own sample
// at LoadScale.
func (c *Config) runInputs(w *workload.Workload, bound float64) ([]runInput, error) {
	first := runInput{prepare(w, c.BlockSize, c.MaxOutputTokens, c.MaxTokens), bound}
	out := make([]runInput, c.Runs)
	for r := range out {
		if r == 0 || len(c.Samples) == 0 {
			out[r] = first
			continue
		}
		sw, err := scaled(c.Samples[r], c.LoadScale)
		if err != nil {
			return nil, err
		}
		out[r] = runInput{prepare(sw, c.BlockSize, c.MaxOutputTokens, c.MaxTokens), sw.UpperBound(c.BlockSize).Ratio}
	}
	return out, nil
}

// scaledWorkload is the workload at LoadScale (a copy when scaled).
func (c *Config) scaledWorkload() (*workload.Workload, error) {
	return scaled(c.Workload, c.LoadScale)
}

// scaled is w at load scale (a copy when scaled).
func scaled(w *workload.Workload, scale float64) (*workload.Workload, error) {
	if scale == 1 {
		return w, nil
	}
	out := *w
	out.Requests = append([]workload.Request(nil), w.Requests...)
	if err := out.ScaleLoad(scale); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return &out, nil
}

// newReport is the report's header: workload, bounds, part, setup and the
// unloaded reference.
func (c *Config) newReport(w *workload.Workload) *report.Report {
	rep := &report.Report{
		Version: report.Version,
		Title:   c.Title,
		Created: time.Now(),
		Workload: report.Workload{
			Name: w.Name, Stats: w.Stats(), LoadScale: c.LoadScale, UpperBound: w.UpperBound(c.BlockSize),
			Part: c.Part, MaxTokens: c.MaxTokens,
		},
		Setup: report.Setup{
			Workers: c.Workers, Fleet: c.Fleet.String(), Replicas: c.Replicas, KVBlocks: c.KVBlocks, BlockSize: c.BlockSize,
			Speedup: c.Speedup, SessionMode: string(c.SessionMode), Seed: c.Seed, GoVersion: runtime.Version(), Runs: c.Runs,
		},
	}
	for i := range w.Requests {
		if w.Requests[i].OutputLength > c.MaxTokens {
			rep.Workload.Truncated++
		}
	}
	if w.BlockTokens > 0 {
		tb := w.TraceBound()
		rep.Workload.TraceBound = &tb
	}
	unl := UnloadedTTFT(w, c.BlockSize, c.MaxBatchedTokens)
	rep.Unloaded = &unl
	for _, p := range c.Paths {
		rep.Setup.Paths = append(rep.Setup.Paths, p.Name)
	}
	return rep
}

// runAll replays every policy over every path, Runs times (run r with seed
// Seed + r, on inputs[r]), and returns each (path, policy)'s summaries in
// the order they first ran.
func (c *Config) runAll(ctx context.Context, rep *report.Report, inputs []runInput) ([][]metrics.Summary, error) {
	type rowKey struct{ path, policy string }
	var order []rowKey
	runs := map[rowKey][]metrics.Summary{}
	run := *c
	for r := range c.Runs {
		run.Seed = c.Seed + uint64(r)
		reqs, bound := inputs[r].reqs, inputs[r].bound
		for _, path := range c.Paths {
			for _, pol := range c.Policies {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				if pol.TrueCache && path.NoTrueCache {
					if r == 0 {
						rep.Notes = append(rep.Notes, fmt.Sprintf("%s did not run over the %s path: the path cannot carry its choice.", pol.Name, path.Name))
					}
					continue
				}
				s, err := runPolicy(ctx, &run, path, pol, reqs, bound)
				if err != nil {
					return nil, fmt.Errorf("replay: policy %s over %s: %w", pol.Name, path.Name, err)
				}
				k := rowKey{path.Name, pol.Name}
				if r == 0 {
					order = append(order, k)
				}
				runs[k] = append(runs[k], s)
				c.Logf("run %d/%d %s (%s): %d done, %d rejected, %d failed, hit %.1f%%, TTFT p50 %.0f ms p99 %.0f ms, wall %.1fs",
					r+1, c.Runs, s.Policy, s.Path, s.Done, s.Rejected, s.Failed, 100*s.HitRatio, s.TTFT.P50, s.TTFT.P99, s.WallSeconds)
			}
		}
	}
	out := make([][]metrics.Summary, len(order))
	for i, k := range order {
		out[i] = runs[k]
	}
	return out, nil
}

// notes are the report's statements of how the run was set up.
func (c *Config) notes(rep *report.Report) []string {
	var out []string
	trueCache := false
	for _, p := range c.Policies {
		out = append(out, fmt.Sprintf("%s: %s.", p.Name, p.About))
		trueCache = trueCache || p.TrueCache
		if p.NoRouterQueue && c.QueueThreshold >= 0 {
			out = append(out, fmt.Sprintf("%s ran without a router queue, as the proxies it stands for do.", p.Name))
		}
		if op, ok := peerOperation(p); ok {
			sc, _ := c.stackConfig(p)
			admission := "no router queue"
			if sc.QueueThreshold > 0 {
				admission = fmt.Sprintf("router queue threshold %g", sc.QueueThreshold)
			}
			predict := "no predict-on-route index"
			if sc.Policy.PredictedTTL > 0 {
				predict = fmt.Sprintf("a predict-on-route index of %v", sc.Policy.PredictedTTL)
			}
			how := "as its authors run it"
			if p.PredictedTTL != 0 && p.PredictedTTL != op.PredictOnRoute {
				how = "as its authors run it but for its predict-on-route index, set here"
			}
			out = append(out, fmt.Sprintf("%s ran %s: %s, %s, sessions %s (%s).", p.Name, how, admission, predict, sc.SessionMode, op.Source))
		}
	}
	out = append(out, c.partNote())
	maxTok := fmt.Sprintf("Every client sent max_tokens %d; routers and bookings saw that, never a request's own output length. Engines generated each request's own output length", c.MaxTokens)
	if n := rep.Workload.Truncated; n > 0 {
		maxTok += fmt.Sprintf(", stopping at max_tokens for the %d requests whose output was longer", n)
	}
	out = append(out, maxTok+".")
	switch {
	case c.QueueThreshold < 0:
		out = append(out, "Router-side queueing was off: every request went to a worker at once and waited there.")
	case c.QueueThreshold > 0:
		out = append(out, fmt.Sprintf("Router queue threshold %g: a worker counts as busy from %g x its max batched tokens of booked prefill (or that fraction of its KV blocks); the peers run with their own admission instead.", c.QueueThreshold, c.QueueThreshold))
	}
	if c.MaxOutputTokens > 0 {
		out = append(out, fmt.Sprintf("Output lengths were capped at %d tokens.", c.MaxOutputTokens))
	}
	switch {
	case c.SessionMode == SessionNone:
		out = append(out, "Session ids were not sent (session mode none).")
	case trueCache:
		out = append(out, fmt.Sprintf("Session ids were sent with %s bindings; true-cache sends none (it names its own worker as a Soft preference), and each peer uses its own session affinity (above).", c.SessionMode))
	default:
		out = append(out, fmt.Sprintf("Session ids were sent with %s bindings; each peer uses its own session affinity (above).", c.SessionMode))
	}
	return out
}
