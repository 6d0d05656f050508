package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/stack"
	"github.com/kvrouter/kvrouter/bench/workload"
)

const demoAbout = `The main job on one machine with nothing installed but Go, kvrouter against
round-robin side by side, each on a fresh stack.

--path real (the default) runs the production path: simulated engines with
vLLM's HTTP API publishing vLLM KV events over ZMQ on loopback, one bridge per
engine, two router replicas on an embedded NATS server, one gateway, and
multi-turn chat sessions (sharing a few long system prompts) streamed by an
OpenAI-compatible client with X-Session-Id. Hit ratio is the engines'
cached_tokens, TTFT the client's wait for the first token. --speedup is the
engines' model clock here, --scale multiplies the 32 sessions, --turns sets
their length.

--path nats runs the NATS-native path: an embedded NATS
server (temporary store), simulated workers publishing KV events, two router
replicas in one queue group, and a built-in synthetic workload (multi-turn
chat sessions sharing a few system prompts, plus agents firing bursts of
sibling requests). The workload runs once through kvrouter's default policy
and once through round-robin, each on a fresh stack, with live progress; then
a table compares them: requests, prefix-cache hit ratio, time to first token
p50/p99, per-worker load spread and sessions that stayed on one worker.

--trace FILE replays a Mooncake-format trace (JSONL: timestamp, input_length,
output_length, hash_ids of 512-token blocks) instead of the synthetic
workload. The whole comparison takes about a minute with the defaults.`

// demoWorkload is the built-in workload: chat sessions and agent bursts
// on one timeline, about 35 s of workload time: 48 chat sessions over 12
// system prompts of 2,048 tokens, and 12 agents firing 3 bursts of 8
// siblings over 4,096 tokens of context. Sized so that 4 workers of 2,048
// blocks cannot all hold every prefix (round-robin has to recompute) and
// load is high enough for recomputation to queue.
func demoWorkload(seed uint64, scale float64) *workload.Workload {
	n := func(v int) int { return max(1, int(float64(v)*scale)) }
	return workload.Merge("demo: chat sessions + agent bursts",
		workload.Chat(workload.ChatConfig{Seed: seed, Sessions: n(48), Turns: 5, SystemPrompts: 12, SystemTokens: 2048,
			UserTokens: 192, OutputTokens: 96, SessionRate: 3, ThinkTime: 2 * time.Second}),
		workload.FanOut(workload.FanOutConfig{Seed: seed + 1, Agents: n(12), Rounds: 3, Siblings: 8, SystemTokens: 2048,
			ContextTokens: 2048, TaskTokens: 96, ResultTokens: 256, OutputTokens: 64, AgentRate: 1.2, RoundGap: 2 * time.Second}),
	)
}

// runDemo parses the flags and runs the path they name: the real path
// (runRealDemo) or the NATS-native replay comparison (runNATSDemo).
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newFlags("kvrouter demo", demoAbout)
	c.SetOutput(stderr)
	c.helpOut = stdout
	f := addDemoFlags(c)
	if err := c.parse(args); err != nil {
		if helpRequested(err) {
			return err
		}
		return usageError{err}
	}
	if *f.speedup < 0 {
		return usageError{fmt.Errorf("--speedup %g: want > 0", *f.speedup)}
	}
	mode, err := replay.ParseSessionMode(*f.sessionMode)
	if err != nil {
		return usageError{err}
	}
	pols, err := replay.LookupPolicies([]string{*f.policies})
	if err != nil {
		return usageError{err}
	}
	switch *f.path {
	case "real":
		rc, err := f.realConfig(mode)
		if err != nil {
			return usageError{err}
		}
		if *f.quiet {
			stderr = io.Discard
		}
		// Spans of the real path's replicas and gateway, as serve's and
		// gateway's flags send them (the nats path has no gateway).
		tracing, err := f.spans.start(ctx, "kvrouter-demo", slog.New(slog.NewTextHandler(stderr, nil)))
		if err != nil {
			return err
		}
		defer tracing.Shutdown(context.Background())
		rc.tracer = tracing.TracerProvider()
		return runRealDemo(ctx, rc, stdout, stderr)
	case "nats":
		return runNATSDemo(ctx, f, mode, pols, stdout, stderr)
	default:
		return usageError{fmt.Errorf("--path %q: want real or nats", *f.path)}
	}
}

// demoFlags are the flags of kvrouter demo: the replay flags it shares
// with bench replay, and its own.
type demoFlags struct {
	*replayFlags
	scale                      *float64
	out, path                  *string
	quiet, showNotes, baseSess *bool
	turns                      *int
	spans                      traceFlags
}

func addDemoFlags(c *cmdFlags) *demoFlags {
	return &demoFlags{
		replayFlags: addReplayFlags(c, replayDefaults{
			limit: 600, workers: 4, replicas: 2, speedup: 0, seed: 7, sessionMode: "hard", policies: "kvrouter,round-robin",
			limitUsage:    "with --trace: replay at most this many requests (0 = all)",
			speedupUsage:  "run the workload (and the workers' clocks) this many times faster than real time (0 = 1.5 for the synthetic workload, 10 for --trace)",
			kvBlocksUsage: "KV blocks per worker (0 = 2,048 at block size 16, 1,024 for traces)",
			sessionUsage:  "session bindings: hard, soft or none (no session ids sent)",
			policiesUsage: "policies to compare (kvrouter, kvrouter-approx, round-robin, random, least-loaded, true-cache)",
		}),
		scale:     c.float("scale", 1, "multiply the synthetic workload's number of sessions and agents"),
		out:       c.str("out", "", "also write report.md, report.json and PNG charts to this directory (\"\" = table only)"),
		quiet:     c.boolean("quiet", false, "no live progress"),
		showNotes: c.boolean("verbose", false, "print the full bench table and notes after the summary"),
		baseSess:  c.boolean("baseline-sessions", false, "send session ids to the baseline policies too (by default they run without affinity, as deployed elsewhere)"),
		path:      c.str("path", "real", "real: vLLM-faced engines with ZMQ events, bridges, replicas, a gateway and an OpenAI-compatible client; nats: NATS-native simulated workers and the replay harness (--trace, --policies, --out need nats)"),
		turns:     c.integer("turns", 4, "with --path real: turns per chat session"),
		spans:     addTraceFlags(c, "requests (with --path real)"),
	}
}

// realConfig checks the flags of --path real and makes its configuration.
func (f *demoFlags) realConfig(mode replay.SessionMode) (realDemoConfig, error) {
	if *f.trace != "" || *f.out != "" || *f.policies != "kvrouter,round-robin" {
		return realDemoConfig{}, fmt.Errorf("--trace, --out and --policies need --path nats (the real path compares kvrouter with round-robin)")
	}
	if *f.speedup < 0 || *f.workers < 1 || *f.replicas < 1 || *f.turns < 1 || *f.scale <= 0 {
		return realDemoConfig{}, fmt.Errorf("--path real: want --speedup >= 0, --workers, --replicas, --turns >= 1 and --scale > 0")
	}
	rc := realDemoConfig{engines: *f.workers, replicas: *f.replicas, kvBlocks: *f.kvBlocks, sessions: max(1, int(32**f.scale)),
		turns: *f.turns, speedup: *f.speedup, seed: *f.seed, sessionMode: mode, baseSessions: *f.baseSess, log: slog.New(slog.DiscardHandler)}
	if rc.kvBlocks == 0 {
		rc.kvBlocks = 640
	}
	if rc.speedup == 0 {
		rc.speedup = 1
	}
	return rc, nil
}

// demoInput is the workload of --path nats and the engine geometry it is
// sized for.
type demoInput struct {
	w         *workload.Workload
	blockSize int
	kvBlocks  int
}

// input loads the trace (512-token blocks) or builds the synthetic
// workload, and fills the defaults that depend on which: KV blocks and
// the speed-up.
func (f *demoFlags) input() (demoInput, error) {
	in := demoInput{blockSize: 16, kvBlocks: *f.kvBlocks}
	if *f.trace != "" {
		w, err := workload.ReadMooncake(*f.trace, workload.ReadOptions{Limit: *f.limit, Sessions: true})
		if err != nil {
			return in, err
		}
		in.w, in.blockSize = w, 512
		if in.kvBlocks == 0 {
			in.kvBlocks = 1024
		}
		if *f.speedup == 0 {
			*f.speedup = 10
		}
	} else {
		in.w = demoWorkload(*f.seed, *f.scale)
		if in.kvBlocks == 0 {
			in.kvBlocks = 2048
		}
		if *f.speedup == 0 {
			*f.speedup = 1.5
		}
	}
	return in, in.w.Validate()
}

// runNATSDemo replays the workload once per policy, each on a fresh
// stack, then prints the comparison (and writes the report with --out).
func runNATSDemo(ctx context.Context, f *demoFlags, mode replay.SessionMode, pols []replay.Policy, stdout, stderr io.Writer) error {
	in, err := f.input()
	if err != nil {
		return err
	}
	st := in.w.Stats()
	fmt.Fprintf(stdout, "kvrouter demo: %s\n  %d requests, %d sessions, %.0f s of workload at %gx speed-up (about %.0f s per policy)\n"+
		"  %d simulated workers (%d KV blocks of %d tokens each), %d router replicas, embedded NATS, %s session bindings for kvrouter\n"+
		"  policies: %s\n\n",
		in.w.Name, st.Requests, st.Sessions, st.SpanSeconds / *f.load, *f.speedup, st.SpanSeconds / *f.load / *f.speedup,
		*f.workers, in.kvBlocks, in.blockSize, *f.replicas, mode, replay.PolicyNames(pols))
	began := time.Now()
	rep, err := f.replayEach(ctx, in, mode, pols, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	printDemoTable(stdout, rep.Policies)
	fmt.Fprintf(stdout, "\nhit ratio = prompt blocks found in the chosen worker's KV cache; infinite-cache bound of this workload %.1f%%.\n",
		100*rep.Workload.UpperBound.Ratio)
	fmt.Fprintf(stdout, "TTFT is model time (the simulated engines' clock, Dynamo's mocker timing) plus routing time. Took %.0f s.\n",
		time.Since(began).Seconds())
	if *f.showNotes {
		fmt.Fprintln(stdout)
		if err := rep.Table(stdout); err != nil {
			return err
		}
	}
	if *f.out != "" {
		files, err := rep.WriteAll(*f.out)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s, %s and %d charts\n", files.Markdown, files.JSON, len(files.Charts))
	}
	return nil
}

// replayEach runs the workload through each policy on a fresh stack and
// merges the runs into one report. kvrouter runs with session bindings
// (its own feature); the baselines run as they are deployed elsewhere,
// without affinity, unless --baseline-sessions is set.
func (f *demoFlags) replayEach(ctx context.Context, in demoInput, mode replay.SessionMode, pols []replay.Policy, stderr io.Writer) (*report.Report, error) {
	rep := &report.Report{}
	for i, pol := range pols {
		m := mode
		if !pol.Events || pol.RouterPolicy != "default" || pol.TrueCache {
			if !*f.baseSess {
				m = replay.SessionNone
			}
		}
		cfg := replay.Config{
			Workload: in.w, Policies: []replay.Policy{pol}, NewStack: stack.Factory(stack.Options{}),
			Model: "demo", Workers: *f.workers, Replicas: *f.replicas, Speedup: *f.speedup, SessionMode: m, Seed: *f.seed,
			KVBlocks: in.kvBlocks, BlockSize: in.blockSize, LoadScale: *f.load, Title: "kvrouter demo",
			Logf: func(format string, a ...any) { fmt.Fprintf(stderr, "  "+format+"\n", a...) },
		}
		if !*f.quiet {
			cfg.Progress = stderr
			cfg.ProgressLines = !isTerminal(stderr)
		}
		r, err := replay.Run(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			*rep = *r
			rep.Policies = nil
			rep.Notes = nil
		}
		for _, p := range r.Policies {
			p.Policy = fmt.Sprintf("%s (sessions: %s)", p.Policy, m)
			rep.Policies = append(rep.Policies, p)
		}
		rep.Notes = append(rep.Notes, r.Notes...)
	}
	rep.Setup.SessionMode = "per policy"
	rep.Checks = replay.Checks(rep)
	return rep, nil
}

// printDemoTable prints the side-by-side comparison the demo is about.
func printDemoTable(w io.Writer, ps []metrics.Summary) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }
	head := []string{""}
	for _, p := range ps {
		head = append(head, p.Policy)
	}
	row(head...)
	line := func(name string, f func(p *metrics.Summary) string) {
		cells := []string{name}
		for i := range ps {
			cells = append(cells, f(&ps[i]))
		}
		row(cells...)
	}
	line("requests done", func(p *metrics.Summary) string { return fmt.Sprintf("%d/%d", p.Done, p.Requests) })
	line("prefix-cache hit ratio", func(p *metrics.Summary) string { return fmt.Sprintf("%.1f%%", 100*p.HitRatio) })
	line("TTFT p50", func(p *metrics.Summary) string { return fmt.Sprintf("%.0f ms", p.TTFT.P50) })
	line("TTFT p99", func(p *metrics.Summary) string { return fmt.Sprintf("%.0f ms", p.TTFT.P99) })
	line("prefill tokens computed", func(p *metrics.Summary) string {
		var n int64
		for _, wl := range p.Workers {
			n += wl.PrefillTokens
		}
		return fmt.Sprintf("%d", n)
	})
	line("load spread (max/mean requests)", func(p *metrics.Summary) string { return fmt.Sprintf("%.2f", p.RequestSpread.MaxOverMean) })
	line("requests per worker", func(p *metrics.Summary) string {
		var parts []string
		for _, wl := range p.Workers {
			parts = append(parts, fmt.Sprint(wl.Requests))
		}
		return strings.Join(parts, "/")
	})
	line("sessions on one worker", func(p *metrics.Summary) string {
		if p.Sessions == 0 {
			return "-"
		}
		return fmt.Sprintf("%d/%d", p.Sessions-p.SessionsMoved, p.Sessions)
	})
	// On the real path the routing decision is the gateway's Server-Timing
	// figure; a run where no policy has one leaves the row out rather than
	// printing "-".
	if slices.ContainsFunc(ps, func(p metrics.Summary) bool { return p.Route.N > 0 }) {
		line("routing decision p50", func(p *metrics.Summary) string {
			if p.Route.N == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f ms", p.Route.P50)
		})
	}
	tw.Flush()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
