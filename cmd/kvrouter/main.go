package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvrouter/kvrouter/internal/buildinfo"
)

const usage = `kvrouter routes LLM requests to the worker that already holds the most of the
prompt's KV cache, keeping load balanced and sessions on their worker.

Usage: kvrouter <command> [flags]

Commands:
  serve    run a router replica (NATS and HTTP route API)
  worker   run simulated workers (--sim) that publish KV events and serve requests
  bridge   join a vLLM or SGLang engine to the fleet (events, registration, load)
  sim      simulated engines that speak vLLM's protocols (sim serve MODEL: OpenAI HTTP,
           /tokenize, /metrics, KV events over ZMQ with replay)
  gateway  the OpenAI-compatible gateway: OpenAI clients in, routed and booked requests out
  epp      the Gateway API endpoint picker: an Envoy ext_proc server that picks the pod of
           an InferencePool for each request, routed and booked as the gateway does
  demo     one command on a fresh machine: embedded NATS, simulated workers, two
           replicas, a synthetic workload, and kvrouter vs round-robin side by side
  bench    replay workloads and compare policies (bench replay), microbenchmarks
           (bench micro)
  version  print the release and the commit this binary was built from (also --version)

Run 'kvrouter <command> --help' for the flags of a command. Every flag can also
be set with an environment variable KVR_<FLAG> (upper case, '-' as '_').
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit code: 0 success, 1
// failure, 2 usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = runServe(ctx, args[1:], stdout, stderr)
	case "worker":
		err = runWorker(ctx, args[1:], stdout, stderr)
	case "demo":
		err = runDemo(ctx, args[1:], stdout, stderr)
	case "bench":
		err = runBench(ctx, args[1:])
	case "bridge":
		err = runBridge(ctx, args[1:], stdout, stderr)
	case "sim":
		err = runSim(ctx, args[1:], stdout, stderr)
	case "gateway":
		err = runGateway(ctx, args[1:], stdout, stderr)
	case "epp":
		err = runEPP(ctx, args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, buildinfo.Get())
		return 0
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "kvrouter: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil, helpRequested(err):
		return 0
	case isUsage(err):
		fmt.Fprintf(stderr, "kvrouter %s: %v\n", args[0], err)
		return 2
	}
	fmt.Fprintf(stderr, "kvrouter %s: %v\n", args[0], err)
	return 1
}

// usageError marks a bad command line.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func isUsage(err error) bool {
	_, ok := err.(usageError)
	return ok
}
