package main

// `kvrouter bench`: the replay harness (bench replay) and the microbenchmark
// report (bench micro). Everything here is flag parsing and wiring; the work
// is in package bench and its subpackages.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/bench/micro"
	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/stack"
	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/workers/sim"
)

const benchUsage = `Usage: kvrouter bench <command> [flags]

Commands:
  replay   replay a workload through the real stack and compare routing policies
  micro    run every Go microbenchmark and write docs/benchmarks.md
  render   redraw report.md and the PNG charts from a replay's report.json

Run 'kvrouter bench <command> -h' for the flags of a command.
`

// runBench dispatches `kvrouter bench ...`.
func runBench(ctx context.Context, args []string) error {
	return benchMain(ctx, args, os.Stdout, os.Stderr)
}

func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := benchCommand(ctx, args, stdout, stderr)
	if helpRequested(err) {
		return nil
	}
	return err
}

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, benchUsage)
		return fmt.Errorf("bench: missing command (replay or micro)")
	}
	switch args[0] {
	case "replay":
		return benchReplay(ctx, args[1:], stdout, stderr)
	case "micro":
		return benchMicro(ctx, args[1:], stdout, stderr)
	case "render":
		return benchRender(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, benchUsage)
		return nil
	}
	fmt.Fprint(stderr, benchUsage)
	return fmt.Errorf("bench: unknown command %q (want replay or micro)", args[0])
}

// benchFlags is the flag set of a bench subcommand: the binary's flags
// (environment variables KVR_<FLAG>, --help on stdout, errors on stderr).
func benchFlags(name, about string, stdout, stderr io.Writer) *cmdFlags {
	c := newFlags(name, about)
	c.SetOutput(stderr)
	c.helpOut = stdout
	return c
}

const benchReplayAbout = `Replays a workload through the real stack, in one process: an embedded NATS
server, simulated workers publishing KV events, router replicas serving the
NATS route API (--path nats), or vLLM-faced simulated engines with ZMQ events,
one bridge each, the replicas and the OpenAI gateway, an OpenAI client per
request (--path gateway). Each policy runs on a fresh fleet with the same
workload; --policies peers adds the peers' algorithms (llmd, sglang, dynamo,
chwbl). Writes report.md, report.json and PNG charts into --out and prints a
table.

Held-out protocol (docs/benchmarks/replay.md): --part eval (the default)
replays a workload's evaluation part, --part tune its tuning part; a policy
tuned on the evaluation part is refused there unless --allow-in-sample.
--calibrate finds the load levels instead (on the tuning part by default);
--describe prints the workload, its part and its infinite-cache bound.

Examples:
  kvrouter bench replay --trace ../shared/data/mooncake/mooncake_fast25_conversation_trace.jsonl --limit 2000 --load 4 --speedup 20
  kvrouter bench replay --workload agent-loop --policies kvrouter,round-robin,peers
  kvrouter bench replay --workload rag --calibrate --limit 800 --speedup 3
  kvrouter bench replay --trace ... --limit 2000 --load 6.5 --speedup 3 --runs 3 --policies kvrouter,peers --path nats,gateway`

// benchReplayFlags are bench replay's own flags beside replayFlags.
type benchReplayFlags struct {
	*replayFlags
	kind, part, out, title, paths, targets, fleet        *string
	cpuProfile, records                                  *string
	sample, blockSize, maxBatched, maxSeqs, maxOut, runs *int
	maxTokens                                            *int
	start, window, deadline                              *time.Duration
	queueTh, transferGBps                                *float64
	quiet, allowInSample, calibrate, describe, samples   *bool
	// given are the flags set on the command line or by their variable.
	given map[string]bool
}

func addBenchReplayFlags(c *cmdFlags) *benchReplayFlags {
	return &benchReplayFlags{
		replayFlags: addReplayFlags(c, replayDefaults{
			limit: 0, workers: 8, replicas: 1, speedup: 10, seed: 1, sessionMode: "none",
			policies:      strings.Join(replay.DefaultPolicies, ","),
			limitUsage:    "replay at most this many requests of the part (0 = all)",
			speedupUsage:  "run the workload this many times faster than real time (workers' clocks too)",
			kvBlocksUsage: "KV blocks per worker (0 = 1 Mi tokens' worth at the block size)",
			sessionUsage:  "session ids and binding mode: none, hard or soft (the peers bind with their own affinity)",
			policiesUsage: "policies to compare, comma separated, or all, or peers (llmd, sglang, dynamo, chwbl); true-cache reads the engines' true caches (a diagnostic); name{key=value,...} runs a policy with other parameters, e.g. kvrouter{overlap_credit=2}",
		}),
		cpuProfile:    c.str("cpuprofile", "", "write a CPU profile of the whole replay to this file; the real path's goroutines carry the label "+stack.ComponentLabel+" (nats, router, engine, bridge, gateway): go tool pprof -tags FILE"),
		records:       c.str("records", "", "also write every request's record of every run to this file, one JSON line each (policy, seed, worker, cached blocks, TTFT...)"),
		kind:          c.str("workload", "", "synthetic workload when no --trace: "+strings.Join(workload.Kinds, ", ")+" (default shared-prefix); --seed s (1-100) generates seed s for --part tune, s+100 for eval"),
		part:          c.str("part", "", "held-out part to replay: eval (the default) or tune (the default with --calibrate); traces split by time (first half tunes), generated workloads by seed"),
		allowInSample: c.boolean("allow-in-sample", false, "run policies on an evaluation part they were tuned on, their rows labelled IN-SAMPLE (refused otherwise)"),
		maxTokens:     c.integer("max-tokens", 0, "max_tokens every client sends, all routers learn of a reply's length (0 = the workload's: 2,048 for traces, per generator otherwise)"),
		sample:        c.integer("sample-sessions", 0, "keep only this many sessions with at least two requests, drawn with --seed (0 = all requests); a trace's hour then keeps its reuse within sessions"),
		start:         c.duration("start", 0, "skip requests arriving before this offset into the part"),
		window:        c.duration("window", 0, "replay only requests arriving within this window after --start (0 = to the end)"),
		blockSize:     c.integer("block-size", 0, "engine block size in tokens (0 = 512 for traces, 16 for synthetic workloads)"),
		maxBatched:    c.integer("max-batched-tokens", 0, "simulated workers' token budget per step (0 = 8192)"),
		maxSeqs:       c.integer("max-seqs", 0, "simulated workers' running requests (0 = 256)"),
		queueTh:       c.float("queue-threshold", 0, "routers' queue threshold as a fraction of a worker's max batched tokens / KV blocks (0 = scheduler default: 8.0 for prefill, 1.0 for decode; negative = no router-side queue); the peers run with their own admission"),
		maxOut:        c.integer("max-output", 0, "cap every request's output tokens (0 = as the workload says)"),
		deadline:      c.duration("route-deadline", 0, "longest wait of a request in a router queue, wall clock (0 = replica default)"),
		out:           c.str("out", "bench-out", "directory for report.md, report.json and the PNG charts"),
		title:         c.str("title", "", "report title"),
		quiet:         c.boolean("quiet", false, "no progress bar"),
		runs:          c.integer("runs", 1, "repeat the whole comparison this many times on the same requests (the routers' and engines' seeds --seed, --seed+1, ...; a generated workload stays the one --seed generates, unless --samples); every figure is then the median with its spread, and the report adds the TTFT of all the runs' requests pooled"),
		samples:       c.boolean("samples", false, "with --runs N and a generated --workload: run r replays its own sample, generated from seed --seed + r (all within the part's seeds), so the medians and the pooled TTFT are over N workload samples instead of one sample's N timings"),
		paths:         c.str("path", replay.PathNATS, "how requests reach the fleet: nats (the route API and the workers' NATS endpoints), gateway (OpenAI clients through the gateway, one bridge per vLLM-faced engine, ZMQ events), or nats,gateway (both, side by side)"),
		calibrate:     c.boolean("calibrate", false, "find the load levels instead of comparing: the --load at which round-robin's TTFT p99 reaches each --calibrate-targets multiple of its unloaded value"),
		targets:       c.str("calibrate-targets", "3,10", "with --calibrate: multiples of the unloaded TTFT p99 to find, comma separated"),
		describe:      c.boolean("describe", false, "print the workload, its part, max_tokens, infinite-cache bound and unloaded TTFT, and exit"),
		fleet:         c.str("fleet", "", "prefill/decode split fleet NpMd (e.g. 4p4d: 4 prefill and 4 decode workers) for the PD policies (kvrouter-pd, round-robin-pd); the others run on an aggregated fleet of the same size; default policies then "+strings.Join(replay.PDPolicies, ",")+" (\"\" = aggregated; docs/pd.md)"),
		transferGBps:  c.float("kv-transfer-gbps", sim.DefaultTransferGBps, "with --fleet: the decode engines' KV transfer bandwidth in GB/s of model time (a block is 128 KiB per token, an 8B model in bf16)"),
	}
}

// benchReplay replays one workload through each policy (and path) and
// writes the report: parse the flags, load the workload, run, write.
func benchReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := benchFlags("kvrouter bench replay", benchReplayAbout, stdout, stderr)
	f := addBenchReplayFlags(c)
	if err := c.parse(args); err != nil {
		return err
	}
	f.given = map[string]bool{}
	c.Visit(func(fl *flag.Flag) { f.given[fl.Name] = true })
	cfg, err := f.config(stderr)
	if err != nil {
		return err
	}
	switch {
	case *f.describe:
		return describeReplay(stdout, cfg)
	case *f.calibrate:
		return calibrateReplay(ctx, stdout, cfg, *f.targets)
	}
	st := cfg.Workload.Stats()
	pols := replay.PolicyNames(cfg.Policies)
	if cfg.Policies == nil {
		pols = strings.Join(replay.PDPolicies, ",")
	}
	fmt.Fprintf(stderr, "replaying %s (%s part): %d requests, %d sessions, %.0f s of workload at %gx load, %gx speed-up; policies %s; path %s\n",
		cfg.Workload.Name, cfg.Part.Part, st.Requests, st.Sessions, st.SpanSeconds / *f.load, *f.load, *f.speedup, pols, *f.paths)
	began := time.Now()
	stopProfile, err := startCPUProfile(*f.cpuProfile)
	if err != nil {
		return err
	}
	closeRecords, err := openRecords(&cfg, *f.records)
	if err != nil {
		return err
	}
	rep, err := replay.Run(ctx, cfg)
	if perr := stopProfile(); err == nil {
		err = perr
	}
	if cerr := closeRecords(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	rep.Setup.Machine = micro.ThisMachine("").CPU
	files, err := rep.WriteAll(*f.out)
	if err != nil {
		return err
	}
	if err := rep.Table(stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nwrote %s, %s and %d charts in %s (%.1f s)\n", filepath.Base(files.Markdown), filepath.Base(files.JSON), len(files.Charts), *f.out, time.Since(began).Seconds())
	return nil
}

// openRecords points cfg.Records at a new file named path ("" = none) and
// returns the function that closes it.
func openRecords(cfg *replay.Config, path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench replay: --records: %w", err)
	}
	cfg.Records = f
	return f.Close, nil
}

// config turns the flags into a replay configuration: policies, the
// workload's part and slice, paths and the fleet.
func (f *benchReplayFlags) config(stderr io.Writer) (replay.Config, error) {
	mode, err := replay.ParseSessionMode(*f.sessionMode)
	if err != nil {
		return replay.Config{}, err
	}
	fleet, err := replay.ParseFleet(*f.fleet)
	if err != nil {
		return replay.Config{}, err
	}
	var pols []replay.Policy // nil: the run's defaults (replay.PDPolicies with a split fleet)
	if !fleet.Split() || f.given["policies"] {
		if pols, err = replay.LookupPolicies([]string{*f.policies}); err != nil {
			return replay.Config{}, err
		}
	}
	workers := *f.workers
	if fleet.Split() && !f.given["workers"] {
		workers = fleet.Prefill + fleet.Decode
	}
	w, part, err := f.workload(*f.seed)
	if err != nil {
		return replay.Config{}, err
	}
	samples, err := f.samplesFrom(w)
	if err != nil {
		return replay.Config{}, err
	}
	rpaths, err := replayPaths(*f.paths)
	if err != nil {
		return replay.Config{}, err
	}
	cfg := replay.Config{
		Workload: w, Samples: samples, Part: part, AllowInSample: *f.allowInSample, Policies: pols, Paths: rpaths, Runs: *f.runs,
		Workers: workers, Fleet: fleet, TransferGBps: *f.transferGBps, Replicas: *f.replicas, Speedup: *f.speedup, SessionMode: mode, Seed: *f.seed,
		KVBlocks: *f.kvBlocks, BlockSize: *f.blockSize, LoadScale: *f.load, MaxBatchedTokens: *f.maxBatched, MaxSeqs: *f.maxSeqs,
		MaxOutputTokens: *f.maxOut, MaxTokens: *f.maxTokens, QueueThreshold: *f.queueTh,
		RouteDeadline: *f.deadline, Title: *f.title,
		Logf: func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) },
	}
	if !*f.quiet {
		cfg.Progress = stderr
		cfg.ProgressLines = !benchIsTerminal(stderr)
	}
	return cfg, nil
}

// samplesFrom is each run's workload with --samples (nil without): first,
// the workload of --seed, then the same part and slice generated from
// --seed + 1, + 2, ...
func (f *benchReplayFlags) samplesFrom(first *workload.Workload) ([]*workload.Workload, error) {
	if !*f.samples {
		return nil, nil
	}
	if *f.trace != "" || *f.calibrate {
		return nil, fmt.Errorf("bench replay: --samples needs a generated --workload and no --calibrate (a trace is one sample)")
	}
	out := []*workload.Workload{first}
	for r := 1; r < *f.runs; r++ {
		w, _, err := f.workload(*f.seed + uint64(r))
		if err != nil {
			return nil, fmt.Errorf("bench replay: --samples: run %d: %w", r+1, err)
		}
		out = append(out, w)
	}
	return out, nil
}

// workload reads the trace or generates the workload from seed, takes the
// held-out part (--part), then the slice (--limit, --start, --window,
// --sample-sessions) within it.
func (f *benchReplayFlags) workload(seed uint64) (*workload.Workload, *workload.PartInfo, error) {
	ps := *f.part
	if ps == "" {
		ps = string(workload.PartEval)
		if *f.calibrate {
			ps = string(workload.PartTune) // choosing a load level is tuning
		}
	}
	part, err := workload.ParsePart(ps)
	if err != nil {
		return nil, nil, err
	}
	var w *workload.Workload
	var info workload.PartInfo
	switch {
	case *f.trace != "" && *f.kind != "":
		return nil, nil, fmt.Errorf("bench replay: give --trace or --workload, not both")
	case *f.trace != "":
		var whole *workload.Workload
		if whole, err = workload.ReadMooncake(*f.trace, workload.ReadOptions{Sessions: true}); err == nil {
			w, info, err = whole.TimePart(part)
		}
	default:
		k := *f.kind
		if k == "" {
			k = "shared-prefix"
		}
		w, info, err = workload.GeneratePart(k, part, seed)
	}
	if err != nil {
		return nil, nil, err
	}
	w = w.Select(*f.limit, *f.start, *f.window)
	if *f.sample > 0 {
		n := len(w.Requests)
		w = w.SampleSessions(*f.sample, 2, seed)
		if len(w.Requests) == 0 {
			return nil, nil, fmt.Errorf("bench replay: --sample-sessions %d kept none of %d requests (no session with two requests)", *f.sample, n)
		}
	}
	if err := w.Validate(); err != nil {
		return nil, nil, err
	}
	return w, &info, nil
}

// describeReplay prints what a replay with cfg would replay, without
// running it.
func describeReplay(stdout io.Writer, cfg replay.Config) error {
	rep, err := replay.Describe(cfg)
	if err != nil {
		return err
	}
	wl, st, ub := rep.Workload, rep.Workload.Stats, rep.Workload.UpperBound
	fmt.Fprintf(stdout, "workload %s, %s part: %s\n", wl.Name, wl.Part.Part, wl.Part.Rule)
	fmt.Fprintf(stdout, "  %d requests, %d sessions, %.0f s span (%.2f req/s at load %g), mean input %.0f / output %.0f tokens\n",
		st.Requests, st.Sessions, st.SpanSeconds, st.RatePerSecond, wl.LoadScale, st.MeanInput, st.MeanOutput)
	fmt.Fprintf(stdout, "  max_tokens %d (%d requests' outputs stop there)\n", wl.MaxTokens, wl.Truncated)
	fmt.Fprintf(stdout, "  infinite-cache bound %.1f %% of %d-token blocks (%d of %d)\n", 100*ub.Ratio, ub.BlockSize, ub.ReusableBlocks, ub.PromptBlocks)
	if tb := wl.TraceBound; tb != nil {
		fmt.Fprintf(stdout, "  trace bound %.1f %% of trace blocks\n", 100*tb.Ratio)
	}
	fmt.Fprintf(stdout, "  unloaded TTFT p50 %.0f ms, p99 %.0f ms\n", rep.Unloaded.P50, rep.Unloaded.P99)
	for _, n := range rep.Notes {
		fmt.Fprintf(stdout, "  %s\n", n)
	}
	return nil
}

// calibrateReplay searches the load levels and prints every probe and the
// levels found.
func calibrateReplay(ctx context.Context, stdout io.Writer, cfg replay.Config, targets string) error {
	var cal replay.Calibration
	for _, t := range splitList(targets) {
		v, err := strconv.ParseFloat(t, 64)
		if err != nil || !(v > 0) {
			return fmt.Errorf("bench replay: --calibrate-targets %q: want positive numbers, comma separated", targets)
		}
		cal.Targets = append(cal.Targets, v)
	}
	cal.Start = cfg.LoadScale
	// The search may double well past its start: at speed-up 1 a workload
	// that starts near its moderate level needs 4-8x that for the high one.
	cal.MaxLoad = max(64, 8*cal.Start)
	res, err := replay.Calibrate(ctx, cfg, cal)
	if res != nil {
		fmt.Fprintf(stdout, "round-robin on %s (%s part), unloaded TTFT p99 %.0f ms\n  load   TTFT p99   ratio\n", cfg.Workload.Name, cfg.Part.Part, res.UnloadedP99)
		for _, p := range res.Points {
			fmt.Fprintf(stdout, "  %-6.3g %8.0f   %5.1fx\n", p.Load, p.P99, p.Ratio)
		}
		for _, l := range res.Levels {
			if l.Found {
				fmt.Fprintf(stdout, "level %gx: --load %.3g (%.1fx)\n", l.Target, l.Load, l.Ratio)
			} else {
				fmt.Fprintf(stdout, "level %gx: not reached up to the highest load probed (at most %g)\n", l.Target, cal.MaxLoad)
			}
		}
	}
	return err
}

// replayPaths resolves --path: nats, gateway or both, comma separated.
func replayPaths(arg string) ([]replay.PathConfig, error) {
	var out []replay.PathConfig
	seen := map[string]bool{}
	for _, n := range strings.Split(arg, ",") {
		n = strings.TrimSpace(n)
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		switch n {
		case replay.PathNATS:
			out = append(out, replay.PathConfig{Name: n, NewStack: stack.Factory(stack.Options{})})
		case replay.PathGateway:
			out = append(out, replay.PathConfig{Name: n, NewStack: stack.GatewayFactory(stack.Options{}), NoTrueCache: true})
		default:
			return nil, fmt.Errorf("bench replay: --path %q: want nats, gateway or nats,gateway", n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench replay: --path is empty: want nats, gateway or nats,gateway")
	}
	return out, nil
}

func benchRender(args []string, stdout, stderr io.Writer) error {
	c := benchFlags("kvrouter bench render", "Redraws report.md, report.json and the PNG charts from a replay's JSON report (--in DIR/report.json); several reports of the same workload, comma separated, are merged into one (e.g. one per path).", stdout, stderr)
	in := c.str("in", "", "report.json written by bench replay (comma separated: merged in order)")
	out := c.str("out", "", "output directory (default: the directory of the first --in)")
	readme := c.boolean("readme-table", false, "also print the README's short results table")
	if err := c.parse(args); err != nil {
		return err
	}
	if *in == "" {
		return fmt.Errorf("bench render: --in is required")
	}
	var reps []*report.Report
	ins := strings.Split(*in, ",")
	for _, name := range ins {
		f, err := os.Open(strings.TrimSpace(name))
		if err != nil {
			return fmt.Errorf("bench render: %w", err)
		}
		r, err := report.ReadJSON(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("bench render: %s: %w", name, err)
		}
		reps = append(reps, r)
	}
	rep := reps[0]
	if len(reps) > 1 {
		if err := rep.Merge(reps[1:]...); err != nil {
			return err
		}
	}
	rep.Checks = replay.Checks(rep) // this build's checks, on the figures read

	dir := *out
	if dir == "" {
		dir = filepath.Dir(strings.TrimSpace(ins[0]))
	}
	files, err := rep.WriteAll(dir)
	if err != nil {
		return err
	}
	if err := rep.Table(stdout); err != nil {
		return err
	}
	if *readme {
		fmt.Fprintln(stdout)
		if err := rep.ReadmeTable(stdout); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\nwrote %s, %s and %d charts in %s\n", filepath.Base(files.Markdown), filepath.Base(files.JSON), len(files.Charts), dir)
	return nil
}

func benchIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

const benchMicroAbout = `Runs every Go microbenchmark of the project:
  go test -p 1 -run '^$' -bench . -benchmem -count N ./...
then writes a Markdown file with each figure (the median of the N runs, as
benchstat computes it) next to its target from the issues, and the machine it
ran on. Run it from the repository (task bench does).`

// benchMicro runs (or reads) the Go benchmarks, writes the Markdown report
// of their figures against the targets and prints how many were met.
func benchMicro(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := benchFlags("kvrouter bench micro", benchMicroAbout, stdout, stderr)
	f := addBenchMicroFlags(c)
	if err := c.parse(args); err != nil {
		return err
	}
	output, command, runErr, err := f.benchOutput(ctx, stderr)
	if err != nil {
		return err
	}
	if *f.raw != "" {
		if err := os.WriteFile(*f.raw, output, 0o644); err != nil {
			return fmt.Errorf("bench micro: %w", err)
		}
	}
	res, err := micro.Parse(strings.NewReader(string(output)))
	if err != nil {
		return err
	}
	if len(res.Benches) == 0 {
		return fmt.Errorf("bench micro: no benchmark results (%v)", runErr)
	}
	m := micro.ThisMachine(res.CPU)
	m.Note = *f.note
	doc := micro.Doc{Machine: m, Command: command, Count: *f.count, Results: res, Targets: micro.Targets}
	if *f.out == "-" {
		return micro.Markdown(stdout, doc)
	}
	doc.Notes = append(doc.Notes, analysisNotes(*f.out)...)
	if err := writeMicroDoc(*f.out, doc); err != nil {
		return err
	}
	met, missed, none := 0, 0, 0
	for _, r := range micro.Evaluate(res, micro.Targets) {
		switch {
		case r.Bench == nil:
			none++
		case r.Met:
			met++
		default:
			missed++
		}
	}
	fmt.Fprintf(stdout, "wrote %s: %d benchmarks; targets met %d, missed %d, not measured %d\n", *f.out, len(res.Benches), met, missed, none)
	return runErr
}

// benchMicroFlags are the flags of bench micro.
type benchMicroFlags struct {
	out, benchtime, bench, pkgs, in, raw, note, timeout *string
	count                                               *int
	verbose                                             *bool
}

func addBenchMicroFlags(c *cmdFlags) *benchMicroFlags {
	return &benchMicroFlags{
		out:       c.str("out", "docs/benchmarks.md", "Markdown file to write (- = stdout)"),
		count:     c.integer("count", 5, "runs of each benchmark (-count); the median is reported"),
		benchtime: c.str("benchtime", "", "go test -benchtime (empty = go's default, 1s)"),
		bench:     c.str("bench", ".", "go test -bench regexp"),
		pkgs:      c.str("pkg", "./...", "packages, comma separated"),
		in:        c.str("in", "", "read `go test -bench` output from this file instead of running it"),
		raw:       c.str("raw", "", "also save the raw go test output to this file"),
		note:      c.str("note", "", "note on the machine (e.g. '2-core shared VM, other jobs running')"),
		timeout:   c.str("timeout", "60m", "go test -timeout"),
		verbose:   c.boolean("v", false, "echo go test output while it runs"),
	}
}

// benchOutput is the `go test -bench` output: read from --in, or from
// running the benchmarks in the module root. command says which; runErr
// is a failed run, reported with what ran; err is a failure to get any.
func (f *benchMicroFlags) benchOutput(ctx context.Context, stderr io.Writer) (output []byte, command string, runErr, err error) {
	opt := micro.RunOptions{Bench: *f.bench, Count: *f.count, Benchtime: *f.benchtime, Timeout: *f.timeout, Packages: strings.Split(*f.pkgs, ",")}
	command = "go " + strings.Join(opt.Args(), " ")
	if *f.in != "" {
		b, err := os.ReadFile(*f.in)
		if err != nil {
			return nil, "", nil, fmt.Errorf("bench micro: %w", err)
		}
		return b, "(parsed from " + *f.in + ")", nil, nil
	}
	dir, err := benchModuleRoot()
	if err != nil {
		return nil, "", nil, err
	}
	opt.Dir = dir
	var echo io.Writer
	if *f.verbose {
		echo = stderr
	}
	fmt.Fprintf(stderr, "running %s in %s\n", command, dir)
	output, runErr = micro.Run(ctx, opt, echo)
	if runErr != nil {
		fmt.Fprintf(stderr, "warning: %v (reporting what ran)\n", runErr)
	}
	return output, command, runErr, nil
}

// analysisNotes links the analyses beside the generated file (how each
// figure was reached, what was tried, why a target is missed): they
// outlive a re-run.
func analysisNotes(out string) []string {
	areas, _ := filepath.Glob(filepath.Join(filepath.Dir(out), "benchmarks", "*.md"))
	var links []string
	for _, a := range areas {
		rel := filepath.ToSlash(filepath.Join("benchmarks", filepath.Base(a)))
		links = append(links, fmt.Sprintf("[%s](%s)", strings.TrimSuffix(filepath.Base(a), ".md"), rel))
	}
	if len(links) == 0 {
		return nil
	}
	return []string{"Analysis per area (setups, profiles, misses explained): " + strings.Join(links, ", ")}
}

// writeMicroDoc writes doc as Markdown to the file out, creating its
// directory; the hand-written sections of the file it replaces are kept.
func writeMicroDoc(out string, doc micro.Doc) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("bench micro: %w", err)
	}
	if prev, err := os.ReadFile(out); err == nil {
		doc.Kept = micro.Kept(string(prev))
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("bench micro: %w", err)
	}
	if err := micro.Markdown(f, doc); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench micro: %w", err)
	}
	return nil
}

// benchModuleRoot finds the directory holding go.mod, from the working
// directory up.
func benchModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("bench micro: no go.mod above the working directory; run it from the repository")
		}
		dir = parent
	}
}

// startCPUProfile starts a CPU profile into path ("" = none) and returns
// what stops it and closes the file.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		return nil
	}, nil
}
