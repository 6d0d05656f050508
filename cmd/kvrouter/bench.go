package main

// `kvrouter bench`: the replay harness (bench replay) and the microbenchmark
// report (bench micro). Everything here is flag parsing and wiring; the work
// is in package bench and its subpackages.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/bench/micro"
	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/stack"
	"github.com/kvrouter/kvrouter/bench/workload"
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

// benchEnv fills every flag not given on the command line from the
// environment variable KVR_<FLAG> (upper case, '-' as '_'), the binary's
// convention for every subcommand.
func benchEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := "KVR_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("bench: %s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

func benchFlagUsage(fs *flag.FlagSet, out io.Writer, head string) func() {
	return func() {
		fmt.Fprint(out, head)
		fs.SetOutput(out)
		fs.PrintDefaults()
		fmt.Fprintln(out, "\nEvery flag can also be set with the environment variable KVR_<FLAG> (upper case, '-' as '_').")
	}
}

const benchReplayHead = `Usage: kvrouter bench replay [flags]

Replays a workload through the real stack, in one process: an embedded NATS
server, simulated workers publishing KV events, router replicas serving the
NATS route API. Each policy runs on a fresh fleet with the same workload.
Writes report.md, report.json and PNG charts into --out and prints a table.

Examples:
  kvrouter bench replay --trace ../shared/data/mooncake/mooncake_fast25_conversation_trace.jsonl --limit 2000 --load 4 --speedup 20
  kvrouter bench replay --workload shared-prefix --policies kvrouter,round-robin,oracle

Flags:
`

func benchReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvrouter bench replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = benchFlagUsage(fs, stderr, benchReplayHead)
	var (
		trace      = fs.String("trace", "", "Mooncake-format JSONL trace to replay (one hash id = one 512-token block)")
		kind       = fs.String("workload", "", "synthetic workload when no --trace: "+strings.Join(workload.Kinds, ", ")+" (default shared-prefix)")
		seed       = fs.Uint64("seed", 1, "seed of synthetic workloads and of random choices")
		nworkers   = fs.Int("workers", 8, "simulated workers")
		replicas   = fs.Int("replicas", 1, "router replicas (one queue group)")
		speedup    = fs.Float64("speedup", 10, "run the workload this many times faster than real time (workers' clocks too)")
		policies   = fs.String("policies", strings.Join(replay.DefaultPolicies, ","), "policies to compare, comma separated, or all")
		limit      = fs.Int("limit", 0, "replay at most this many requests (0 = all)")
		sample     = fs.Int("sample-sessions", 0, "keep only this many sessions with at least two requests, drawn with --seed (0 = all requests); a trace's hour then keeps its reuse within sessions")
		start      = fs.Duration("start", 0, "skip requests arriving before this offset into the workload")
		window     = fs.Duration("window", 0, "replay only requests arriving within this window after --start (0 = to the end)")
		sessMode   = fs.String("session-mode", "none", "session ids and binding mode: none, hard or soft")
		kvBlocks   = fs.Int("kv-blocks", 0, "KV blocks per worker (0 = 1 Mi tokens' worth at the block size)")
		blockSize  = fs.Int("block-size", 0, "engine block size in tokens (0 = 512 for traces, 16 for synthetic workloads)")
		load       = fs.Float64("load", 1, "load scaling: multiply the workload's arrival rate")
		maxBatched = fs.Int("max-batched-tokens", 0, "simulated workers' token budget per step (0 = 8192)")
		maxSeqs    = fs.Int("max-seqs", 0, "simulated workers' running requests (0 = 256)")
		queueTh    = fs.Float64("queue-threshold", 0, "routers' queue threshold as a fraction of a worker's max batched tokens / KV blocks (0 = scheduler default: 2.0 for prefill, 1.0 for decode; negative = no router-side queue)")
		maxOut     = fs.Int("max-output", 0, "cap every request's output tokens (0 = as the workload says)")
		deadline   = fs.Duration("route-deadline", 0, "longest wait of a request in a router queue, wall clock (0 = replica default)")
		out        = fs.String("out", "bench-out", "directory for report.md, report.json and the PNG charts")
		title      = fs.String("title", "", "report title")
		quiet      = fs.Bool("quiet", false, "no progress bar")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := benchEnv(fs); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench replay: unexpected argument %q", fs.Arg(0))
	}
	mode, err := replay.ParseSessionMode(*sessMode)
	if err != nil {
		return err
	}
	pols, err := replay.LookupPolicies([]string{*policies})
	if err != nil {
		return err
	}
	var w *workload.Workload
	switch {
	case *trace != "" && *kind != "":
		return fmt.Errorf("bench replay: give --trace or --workload, not both")
	case *trace != "":
		w, err = workload.ReadMooncake(*trace, workload.ReadOptions{Limit: *limit, Start: *start, Window: *window, Sessions: true})
	default:
		k := *kind
		if k == "" {
			k = "shared-prefix"
		}
		if w, err = workload.Generate(k, *seed); err == nil {
			w = w.Select(*limit, *start, *window)
		}
	}
	if err != nil {
		return err
	}
	if *sample > 0 {
		n := len(w.Requests)
		w = w.SampleSessions(*sample, 2, *seed)
		if len(w.Requests) == 0 {
			return fmt.Errorf("bench replay: --sample-sessions %d kept none of %d requests (no session with two requests)", *sample, n)
		}
	}
	if err := w.Validate(); err != nil {
		return err
	}
	cfg := replay.Config{
		Workload: w, Policies: pols, NewStack: stack.Factory(stack.Options{}),
		Workers: *nworkers, Replicas: *replicas, Speedup: *speedup, SessionMode: mode, Seed: *seed,
		KVBlocks: *kvBlocks, BlockSize: *blockSize, LoadScale: *load, MaxBatchedTokens: *maxBatched, MaxSeqs: *maxSeqs,
		MaxOutputTokens: *maxOut, QueueThreshold: *queueTh,
		RouteDeadline: *deadline, Title: *title,
		Logf: func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) },
	}
	if !*quiet {
		cfg.Progress = stderr
		cfg.ProgressLines = !benchIsTerminal(stderr)
	}
	st := w.Stats()
	fmt.Fprintf(stderr, "replaying %s: %d requests, %d sessions, %.0f s of workload at %gx load, %gx speed-up; policies %s\n",
		w.Name, st.Requests, st.Sessions, st.SpanSeconds / *load, *load, *speedup, replay.PolicyNames(pols))
	began := time.Now()
	rep, err := replay.Run(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Setup.Machine = micro.ThisMachine("").CPU
	files, err := rep.WriteAll(*out)
	if err != nil {
		return err
	}
	if err := rep.Table(stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nwrote %s, %s and %d charts in %s (%.1f s)\n", filepath.Base(files.Markdown), filepath.Base(files.JSON), len(files.Charts), *out, time.Since(began).Seconds())
	return nil
}

func benchRender(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvrouter bench render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = benchFlagUsage(fs, stderr, "Usage: kvrouter bench render --in DIR/report.json [--out DIR]\n\nRedraws report.md, report.json and the PNG charts from a replay's JSON report.\n\nFlags:\n")
	in := fs.String("in", "", "report.json written by bench replay")
	out := fs.String("out", "", "output directory (default: the directory of --in)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *in == "" {
		return fmt.Errorf("bench render: --in is required")
	}
	f, err := os.Open(*in)
	if err != nil {
		return fmt.Errorf("bench render: %w", err)
	}
	rep, err := report.ReadJSON(f)
	f.Close()
	if err != nil {
		return err
	}
	dir := *out
	if dir == "" {
		dir = filepath.Dir(*in)
	}
	files, err := rep.WriteAll(dir)
	if err != nil {
		return err
	}
	if err := rep.Table(stdout); err != nil {
		return err
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

const benchMicroHead = `Usage: kvrouter bench micro [flags]

Runs every Go microbenchmark of the project:
  go test -run '^$' -bench . -benchmem -count N ./...
then writes a Markdown file with each figure (the median of the N runs, as
benchstat computes it) next to its target from the issues, and the machine it
ran on. Run it from the repository (task bench does).

Flags:
`

func benchMicro(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvrouter bench micro", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = benchFlagUsage(fs, stderr, benchMicroHead)
	var (
		out       = fs.String("out", "docs/benchmarks.md", "Markdown file to write (- = stdout)")
		count     = fs.Int("count", 5, "runs of each benchmark (-count); the median is reported")
		benchtime = fs.String("benchtime", "", "go test -benchtime (empty = go's default, 1s)")
		bench     = fs.String("bench", ".", "go test -bench regexp")
		pkgs      = fs.String("pkg", "./...", "packages, comma separated")
		in        = fs.String("in", "", "read `go test -bench` output from this file instead of running it")
		raw       = fs.String("raw", "", "also save the raw go test output to this file")
		note      = fs.String("note", "", "note on the machine (e.g. '2-core shared VM, other jobs running')")
		timeout   = fs.String("timeout", "60m", "go test -timeout")
		verbose   = fs.Bool("v", false, "echo go test output while it runs")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := benchEnv(fs); err != nil {
		return err
	}
	opt := micro.RunOptions{Bench: *bench, Count: *count, Benchtime: *benchtime, Timeout: *timeout, Packages: strings.Split(*pkgs, ",")}
	var output []byte
	var runErr error
	command := "go " + strings.Join(opt.Args(), " ")
	if *in != "" {
		b, err := os.ReadFile(*in)
		if err != nil {
			return fmt.Errorf("bench micro: %w", err)
		}
		output, command = b, "(parsed from "+*in+")"
	} else {
		dir, err := benchModuleRoot()
		if err != nil {
			return err
		}
		opt.Dir = dir
		var echo io.Writer
		if *verbose {
			echo = stderr
		}
		fmt.Fprintf(stderr, "running %s in %s\n", command, dir)
		output, runErr = micro.Run(ctx, opt, echo)
		if runErr != nil {
			fmt.Fprintf(stderr, "warning: %v (reporting what ran)\n", runErr)
		}
	}
	if *raw != "" {
		if err := os.WriteFile(*raw, output, 0o644); err != nil {
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
	m.Note = *note
	doc := micro.Doc{Machine: m, Command: command, Count: *count, Results: res, Targets: micro.Targets}
	if *out != "-" {
		// The analyses beside the generated file (how each figure was
		// reached, what was tried, why a target is missed) outlive a re-run.
		areas, _ := filepath.Glob(filepath.Join(filepath.Dir(*out), "benchmarks", "*.md"))
		var links []string
		for _, a := range areas {
			rel := filepath.ToSlash(filepath.Join("benchmarks", filepath.Base(a)))
			links = append(links, fmt.Sprintf("[%s](%s)", strings.TrimSuffix(filepath.Base(a), ".md"), rel))
		}
		if len(links) > 0 {
			doc.Notes = append(doc.Notes, "Analysis per area (setups, profiles, misses explained): "+strings.Join(links, ", "))
		}
	}
	if *out == "-" {
		return micro.Markdown(stdout, doc)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return fmt.Errorf("bench micro: %w", err)
	}
	f, err := os.Create(*out)
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
	fmt.Fprintf(stdout, "wrote %s: %d benchmarks; targets met %d, missed %d, not measured %d\n", *out, len(res.Benches), met, missed, none)
	return runErr
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
