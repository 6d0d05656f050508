package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

const simUsage = `Usage: kvrouter sim serve MODEL [flags]

Run simulated engines that speak vLLM's protocols (OpenAI HTTP API, /tokenize,
Prometheus /metrics, KV events over ZMQ with replay). Run
'kvrouter sim serve --help' for the flags.
`

const simServeAbout = `Run a simulated engine shaped like 'vllm serve MODEL': the simulated core of
'kvrouter worker --sim' (block KV cache with LRU, continuous batching, chunked
prefill, Dynamo's mocker timing) behind vLLM's interfaces. HTTP on --host:--port:
POST /v1/completions, /v1/chat/completions (streamed or not), /tokenize,
/detokenize; GET /v1/models, /health, /metrics (vLLM's metric names). KV-cache
events over ZMQ as vLLM publishes them when --kv-events-config enables them.
The tokenizer is byte-level and the chat template is documented in
docs/simulator.md. MODEL is the model name (or give --model).

--count N starts N engines in this process: engine i serves HTTP on --port + i
and publishes events on the --kv-events-config ports + i x --data-parallel-size
(+ rank). vLLM flags the simulator has no use for (--gpu-memory-utilization,
--tensor-parallel-size, --dtype, ...) are accepted and ignored, so a launch
script written for vLLM runs unchanged. --enable-lora with --lora-modules (and
--max-loras, --max-cpu-loras, --max-lora-rank) serves LoRA adapters as vLLM
does, VLLM_ALLOW_RUNTIME_LORA_UPDATING=true enabling their loading at run
time; a step that needs an adapter not resident spends --lora-load-time.

SIGINT/SIGTERM stop cleanly: the HTTP servers stop taking requests and finish
the ones in flight (at most --shutdown-timeout), then the engines close
(publishing AllBlocksCleared) and the ZMQ sockets close.`

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "serve" {
		return runSimServe(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(stdout, simUsage)
		return flag.ErrHelp
	}
	return usageError{errors.New("want 'kvrouter sim serve MODEL [flags]'")}
}

// simServeFlags are the flags of sim serve, named as vLLM's.
type simServeFlags struct {
	host, model, served, kvEvents           *string
	port, blockSize, numBlocks, maxModelLen *int
	maxSeqs, maxBatched, dp, count          *int
	imageTokens                             *int
	speedup                                 *float64
	shutdown                                *time.Duration
	lora                                    *simLoRAFlags
	pd                                      *simPDFlags

	// The simulated model's rendering (not vLLM flags).
	bos, noRender *bool
	// Where the engines' llm_request spans go, as serve's and gateway's.
	trace traceFlags
}

func addSimServeFlags(c *cmdFlags) *simServeFlags {
	f := &simServeFlags{
		host:        c.str("host", "", "host name or address the HTTP server listens on (\"\" = all interfaces, as vLLM)"),
		port:        c.integer("port", 8000, "HTTP port (engine i of --count listens on port + i)"),
		model:       c.str("model", "", "model name, when it is not given as the MODEL argument"),
		served:      c.str("served-model-name", "", "model name in the API (\"\" = MODEL)"),
		blockSize:   c.integer("block-size", sim.DefaultBlockSize, "KV block size in tokens"),
		numBlocks:   c.integer("num-gpu-blocks", sim.DefaultKVBlocks, "KV cache capacity in blocks, per data-parallel rank (vLLM's --num-gpu-blocks-override)"),
		maxModelLen: c.integer("max-model-len", vllmapi.DefaultMaxModelLen, "context length: prompt plus max_tokens of one request, in tokens"),
		maxSeqs:     c.integer("max-num-seqs", sim.DefaultMaxSeqs, "running requests per rank"),
		maxBatched:  c.integer("max-num-batched-tokens", sim.DefaultMaxBatchedTokens, "token budget of one engine step (chunked prefill)"),
		speedup:     c.float("speedup", sim.DefaultSpeedup, "model time runs this many times faster than the wall clock (not a vLLM flag)"),
		dp:          c.integer("data-parallel-size", 1, "data-parallel ranks per engine, each with its own KV cache; rank r publishes events on the endpoints' port + r"),
		kvEvents:    c.str("kv-events-config", "", "vLLM's KV events config, JSON: {\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5558\",\"buffer_steps\":10000,\"hwm\":100000,\"topic\":\"\"} (\"\" = no events)"),
		count:       c.integer("count", 1, "number of engines in this process, on consecutive ports (not a vLLM flag)"),
		shutdown:    c.duration("shutdown-timeout", 10*time.Second, "longest wait for requests in flight when stopping (not a vLLM flag)"),
		lora:        addSimLoRAFlags(c),
		pd:          addSimPDFlags(c),
		imageTokens: c.integer("sim-image-tokens", vllmapi.DefaultImageTokens, "placeholder tokens an image_url content part expands to (not a vLLM flag: vLLM's count depends on the model and the image)"),
	}
	f.bos = c.boolean("bos-token", false, "the tokenizer has a BOS token (id 256), put in front of a prompt whose request has add_special_tokens (the default of completions), as Llama's (not a vLLM flag)")
	f.trace = addTraceFlags(c, "requests")
	f.noRender = c.boolean("disable-render-endpoints", false, "serve no POST /v1/chat/completions/render and /v1/completions/render, as a vLLM from before them (not a vLLM flag)")
	// Accepted for launch scripts written for vLLM; the simulator ignores them.
	c.float("gpu-memory-utilization", 0.9, "ignored (vLLM flag)")
	c.integer("tensor-parallel-size", 1, "ignored (vLLM flag)")
	c.integer("pipeline-parallel-size", 1, "ignored (vLLM flag)")
	c.integer("seed", 0, "ignored (vLLM flag; the filler text is deterministic per request id)")
	c.str("dtype", "auto", "ignored (vLLM flag)")
	c.str("api-key", "", "ignored (vLLM flag; the simulator checks no key)")
	for _, name := range []string{"enable-prefix-caching", "enable-chunked-prefill", "disable-log-requests",
		"disable-log-stats", "trust-remote-code", "enforce-eager", "enable-prompt-tokens-details"} {
		c.boolean(name, false, "ignored (vLLM flag; the simulator always behaves as if it were given)")
	}
	return f
}

func runSimServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newFlags("kvrouter sim serve MODEL", simServeAbout)
	c.SetOutput(stderr)
	c.helpOut = stdout
	lf := addLogFlags(c)
	f := addSimServeFlags(c)
	model, rest := splitPositional(c.FlagSet, expandNargs(args))
	if err := c.parse(rest); err != nil {
		if helpRequested(err) {
			return err
		}
		return usageError{err}
	}
	cfg, err := f.config(model)
	if err != nil {
		return usageError{err}
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return usageError{err}
	}
	tracing, err := f.trace.start(ctx, "kvrouter-sim", log)
	if err != nil {
		return err
	}
	defer tracing.Shutdown(context.Background())
	cfg.tracer = tracing.TracerProvider()
	engines, err := startSimEngines(cfg, log)
	if err != nil {
		return err
	}
	return serveSimEngines(ctx, engines, cfg, stdout, log)
}

// splitPositional takes the first argument that is not a flag or a flag's
// value out of args: vLLM puts MODEL before or after its flags.
func splitPositional(fs *flag.FlagSet, args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			rest := append(append([]string(nil), args[:i]...), args[i+1:]...)
			return a, rest
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if hasValue {
			continue
		}
		if fl := fs.Lookup(name); fl != nil {
			if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				continue
			}
			i++ // the flag's value
		}
	}
	return "", args
}

// simServeConfig is the validated command line.
type simServeConfig struct {
	model, served, host string
	port, count, dp     int
	maxModelLen         int
	imageTokens         int
	shutdown            time.Duration
	engine              sim.Config
	events              vllmzmq.Config
	// LoRA (sim_lora.go)
	enableLoRA, runtimeLoRA bool
	adapters                []vllmapi.Adapter

	bos, noRender bool // vllmapi.Config.BOS and DisableRender
	// prefill/decode disaggregation (sim_pd.go)
	kvTransfer *vllmapi.KVTransferConfig
	disagg     string
	// tracer receives the engines' spans (nil: none).
	tracer trace.TracerProvider
}

func (f *simServeFlags) config(model string) (simServeConfig, error) {
	switch {
	case model != "" && *f.model != "" && model != *f.model:
		return simServeConfig{}, fmt.Errorf("MODEL %q and --model %q disagree", model, *f.model)
	case model == "":
		model = *f.model
	}
	if model == "" {
		return simServeConfig{}, errors.New("no model: give MODEL (kvrouter sim serve MODEL [flags]) or --model")
	}
	cfg := simServeConfig{
		model: model, served: *f.served, host: *f.host, port: *f.port, count: *f.count, dp: *f.dp,
		maxModelLen: *f.maxModelLen, imageTokens: *f.imageTokens, shutdown: *f.shutdown,
		engine: sim.Config{Model: model, Ranks: *f.dp, BlockSize: *f.blockSize, KVBlocks: *f.numBlocks,
			MaxBatchedTokens: *f.maxBatched, MaxSeqs: *f.maxSeqs, Speedup: *f.speedup},
	}
	if cfg.served == "" {
		cfg.served = model
	}
	cfg.bos, cfg.noRender = *f.bos, *f.noRender
	switch {
	case cfg.count < 1:
		return cfg, fmt.Errorf("--count %d: want at least 1", cfg.count)
	case cfg.dp < 1:
		return cfg, fmt.Errorf("--data-parallel-size %d: want at least 1", cfg.dp)
	case cfg.port < 0 || cfg.port+cfg.count-1 > 65535:
		return cfg, fmt.Errorf("--port %d with --count %d: ports must stay in 0..65535", cfg.port, cfg.count)
	case cfg.port == 0 && cfg.count > 1:
		return cfg, fmt.Errorf("--port 0 (any free port) works with --count 1 only")
	case cfg.maxModelLen < 1:
		return cfg, fmt.Errorf("--max-model-len %d: want at least 1", cfg.maxModelLen)
	case cfg.imageTokens < 1:
		return cfg, fmt.Errorf("--sim-image-tokens %d: want at least 1", cfg.imageTokens)
	case !(*f.speedup > 0):
		return cfg, fmt.Errorf("--speedup %g: want more than 0", *f.speedup)
	}
	// sim.Config reads 0 as "default": refuse it here, where 0 was typed.
	for _, v := range []struct {
		flag string
		n    int
	}{{"block-size", *f.blockSize}, {"num-gpu-blocks", *f.numBlocks}, {"max-num-seqs", *f.maxSeqs}, {"max-num-batched-tokens", *f.maxBatched}} {
		if v.n < 1 {
			return cfg, fmt.Errorf("--%s %d: want at least 1", v.flag, v.n)
		}
	}
	cfg.events = vllmzmq.Config{} // zero value: events disabled
	if *f.kvEvents != "" {
		ev, err := vllmzmq.ParseKVEventsConfig([]byte(*f.kvEvents))
		if err != nil {
			return cfg, fmt.Errorf("--kv-events-config: %w", err)
		}
		cfg.events = ev
	}
	if err := f.pd.apply(&cfg); err != nil {
		return cfg, err
	}
	return cfg, f.lora.apply(&cfg)
}

// simEngine is one engine of the process with its faces.
type simEngine struct {
	eng    *sim.Engine
	events *sim.VLLMEvents
	http   *http.Server
	ln     net.Listener
}

// startSimEngines builds every engine, its event sockets and its HTTP
// listener; on an error it closes what it opened.
func startSimEngines(cfg simServeConfig, log *slog.Logger) ([]*simEngine, error) {
	var out []*simEngine
	fail := func(err error) ([]*simEngine, error) {
		closeSimEngines(out)
		return nil, err
	}
	for i := range cfg.count {
		port := cfg.port + i
		se := &simEngine{}
		out = append(out, se)
		evcfg, err := cfg.events.ForRank(i * cfg.dp)
		if err != nil {
			return fail(usageError{fmt.Errorf("--kv-events-config for engine %d: %w", i, err)})
		}
		if se.events, err = sim.NewVLLMEvents(evcfg, cfg.dp, log); err != nil {
			return fail(fmt.Errorf("engine %d: KV events: %w", i, err))
		}
		ec := cfg.engine
		ec.Worker = "sim-" + strconv.Itoa(port)
		ec.NewEmitter = se.events.Factory()
		if se.eng, err = sim.New(ec); err != nil {
			return fail(usageError{fmt.Errorf("engine %d: %w", i, err)})
		}
		api, err := vllmapi.New(vllmapi.Config{Engine: se.eng, Model: cfg.served, MaxModelLen: cfg.maxModelLen, ImageTokens: cfg.imageTokens, Logger: log,
			EnableLoRA: cfg.enableLoRA, Adapters: cfg.adapters, RuntimeLoRA: cfg.runtimeLoRA, BOS: cfg.bos, DisableRender: cfg.noRender,
			KVTransfer: cfg.transferFor(i, ec.Worker), Disaggregation: cfg.disagg,
			TracerProvider: cfg.tracer})
		if err != nil {
			return fail(usageError{fmt.Errorf("engine %d: %w", i, err)})
		}
		if se.ln, err = net.Listen("tcp", net.JoinHostPort(cfg.host, strconv.Itoa(port))); err != nil {
			return fail(fmt.Errorf("engine %d: %w", i, err))
		}
		se.http = &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	}
	return out, nil
}

// closeSimEngines closes engines first (their last AllBlocksCleared is
// published on the way out), then the event sockets and listeners.
func closeSimEngines(engines []*simEngine) error {
	var errs []error
	for _, se := range engines {
		if se.eng != nil {
			errs = append(errs, se.eng.Close(context.Background()))
		}
		if se.events != nil {
			errs = append(errs, se.events.Close())
		}
		if se.ln != nil {
			se.ln.Close() // already closed by Serve's Shutdown, or never served
		}
	}
	return errors.Join(errs...)
}

// serveSimEngines runs the engines and their HTTP servers until ctx ends,
// then stops them in order.
func serveSimEngines(ctx context.Context, engines []*simEngine, cfg simServeConfig, stdout io.Writer, log *slog.Logger) error {
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	served := make(chan error, len(engines))
	ran := make(chan error, len(engines))
	for i, se := range engines {
		go func() { ran <- se.eng.Run(runCtx) }()
		go func() { served <- se.http.Serve(se.ln) }()
		fmt.Fprintf(stdout, "engine %d: model %q on http://%s (%d rank(s), %d KV blocks of %d tokens each)%s%s\n",
			i, cfg.served, se.ln.Addr(), cfg.dp, cfg.engine.KVBlocks, cfg.engine.BlockSize, eventsWhere(se.events, cfg.dp), loraWhat(cfg))
	}
	var err error
	select {
	case <-ctx.Done():
		log.Info("signal received: stopping the simulated engines")
	case err = <-served:
		err = fmt.Errorf("HTTP server: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdown)
	defer cancel()
	for _, se := range engines {
		if serr := se.http.Shutdown(sctx); serr != nil {
			se.http.Close() // requests still in flight: their clients see the connection end
		}
	}
	cerr := closeSimEngines(engines)
	stopRun()
	for range engines {
		<-ran
	}
	return errors.Join(err, cerr)
}

func eventsWhere(v *sim.VLLMEvents, ranks int) string {
	if !v.Enabled() {
		return ", KV events off"
	}
	var b strings.Builder
	for r := range ranks {
		p := v.Publisher(r)
		fmt.Fprintf(&b, "; rank %d events %s", r, p.Endpoint())
		if re := p.ReplayEndpoint(); re != "" {
			fmt.Fprintf(&b, " replay %s", re)
		}
	}
	return b.String()
}
