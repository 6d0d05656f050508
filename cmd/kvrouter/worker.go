package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
)

const workerAbout = `Run simulated workers: GPU-free engines with a block KV cache (prefix reuse,
LRU eviction), continuous batching with chunked prefill and NVIDIA Dynamo's
mocker timing model. Each worker registers in the worker registry (heartbeat
and per-key TTL), publishes its KV events to the event stream and its load
every --load-interval, and serves generate requests on
<prefix>.worker.<model>.<id>.generate (its endpoint in route answers).

SIGINT/SIGTERM drain the workers gracefully: state draining, wait for
in-flight requests, deregister, publish Cleared.`

func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newFlags("kvrouter worker", workerAbout)
	c.SetOutput(stderr)
	c.helpOut = stdout
	nf := addNATSFlags(c, false)
	lf := addLogFlags(c)
	var (
		simF       = c.boolean("sim", false, "run simulated workers (required: real engines publish with their own kvevents publisher)")
		count      = c.integer("count", 4, "number of simulated workers in this process")
		idPrefix   = c.str("id-prefix", "sim", "worker ids are <id-prefix>-0 .. <id-prefix>-<count-1>; unique per fleet")
		model      = c.str("model", "default", "model the workers serve")
		ranks      = c.integer("ranks", 1, "data-parallel ranks per worker (each with its own KV cache)")
		blockSize  = c.integer("block-size", sim.DefaultBlockSize, "KV block size in tokens (routers must use the same)")
		kvBlocks   = c.integer("kv-blocks", sim.DefaultKVBlocks, "KV cache blocks per rank")
		maxBatched = c.integer("max-batched-tokens", sim.DefaultMaxBatchedTokens, "token budget of one engine step (chunked prefill)")
		maxSeqs    = c.integer("max-seqs", sim.DefaultMaxSeqs, "running requests per rank")
		speedup    = c.float("speedup", sim.DefaultSpeedup, "model time runs this many times faster than the wall clock")
		loadEvery  = c.duration("load-interval", workers.DefaultLoadInterval, "period of load reports on <prefix>.load.<model>.<id>")
		engKeyed   = c.boolean("engine-keyed", false, "publish engine-keyed event batches (wire version 1) instead of sequence-keyed ones (version 2): only while some routers of --model run a release from before sequence-keyed batches, which refuse version 2")
	)
	ws := addWorkerSideFlags(c, 5*time.Millisecond, "in-flight requests")
	if err := c.parse(args); err != nil {
		if helpRequested(err) {
			return err
		}
		return usageError{err}
	}
	if !*simF {
		return usageError{fmt.Errorf("only simulated workers can run here: pass --sim (real engines publish KV events with their own kvevents publisher)")}
	}
	if *count < 1 {
		return usageError{fmt.Errorf("--count %d: want at least 1", *count)}
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return usageError{err}
	}
	nc, js, err := ws.connect(ctx, nf, "kvrouter-worker", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	fleet, err := sim.NewFleet(sim.FleetConfig{
		Count:    *count,
		IDPrefix: *idPrefix,
		Engine: sim.Config{Model: *model, Prefix: *ws.prefix, Ranks: *ranks, BlockSize: *blockSize, KVBlocks: *kvBlocks,
			MaxBatchedTokens: *maxBatched, MaxSeqs: *maxSeqs, Speedup: *speedup},
		NewEmitter:   sim.PublisherFactory(js, kvevents.PublisherConfig{Prefix: *ws.prefix, Model: *model, MaxDelay: *ws.maxDelay, SeqKeyed: !*engKeyed}),
		Registry:     ws.registry(log),
		LoadInterval: *loadEvery,
		Drain:        workers.DrainConfig{MaxWait: *ws.drain},
		Logger:       log,
	})
	if err != nil {
		return usageError{err}
	}
	if err := fleet.Start(ctx, nc.Conn, js); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// A stop signal during start-up is a stop, not a failure:
			// Start has torn down what it had started.
			log.Info("stopped during start-up", "err", err)
			return nil
		}
		return err
	}
	fmt.Fprintf(stdout, "%d simulated workers of model %q running (%s-0..%s-%d), NATS %s\n",
		*count, *model, *idPrefix, *idPrefix, *count-1, nc.Where())
	<-ctx.Done()
	log.Info("signal received: draining workers")
	sctx, cancel := context.WithTimeout(context.Background(), *ws.drain+10*time.Second)
	defer cancel()
	return fleet.Stop(sctx)
}
