package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/bridge"
)

const bridgeAbout = `Join one vLLM or SGLang engine to a kvrouter fleet: a sidecar next to the
engine. It follows the engine's KV events over ZMQ (one SUB per data-parallel
rank, the replay socket for gaps) and relays them into the JetStream event
stream; registers the worker (endpoint = --engine-url exactly as given, or
its scheme and path on --advertise-addr, the address gateways see; its
ranks, block size and capacity) once the engine's /health and /metrics answer,
marks it unavailable while /health fails or its load is stale, and publishes
the engine's /metrics as load reports every --metrics-interval. Its own
/healthz, /readyz (503 until registered and available) and /metrics are on
--http-addr. docs/bridge.md has the walk-through.

SIGINT/SIGTERM drain: state draining, wait for the engine's requests in flight
(at most --drain-timeout), deregister, flush the events.`

// bridgePDFlags are the engine's own disaggregation flags, mirrored.
type bridgePDFlags struct {
	kvTransfer, disaggMode *string
	bootstrap              *int
}

func addBridgePDFlags(c *cmdFlags) *bridgePDFlags {
	return &bridgePDFlags{
		kvTransfer: c.str("kv-transfer-config", "", "the vLLM engine's --kv-transfer-config JSON: its kv_role sets the worker's role (kv_producer: prefill, kv_consumer: decode, kv_both: both; docs/pd.md)"),
		disaggMode: c.str("disaggregation-mode", "", "the SGLang engine's --disaggregation-mode (prefill or decode; \"\" = not disaggregated)"),
		bootstrap:  c.integer("disaggregation-bootstrap-port", 0, "the SGLang prefill engine's --disaggregation-bootstrap-port (registered for gateways; 0 = 8998 with --disaggregation-mode prefill)"),
	}
}

// role is the role the bridge registers, mirroring the engine's own
// flags: vLLM's kv_role or SGLang's disaggregation mode (not both), and an
// SGLang prefill server's bootstrap port.
func (f *bridgePDFlags) role() (workers.Role, int, error) {
	kvTransferConfig, disaggMode, bootstrapPort := *f.kvTransfer, *f.disaggMode, *f.bootstrap
	if kvTransferConfig != "" && disaggMode != "" {
		return "", 0, errors.New("--kv-transfer-config (vLLM) and --disaggregation-mode (SGLang) are exclusive")
	}
	if disaggMode != "" {
		role, err := workers.ParseRole(disaggMode)
		if err != nil {
			return "", 0, fmt.Errorf("--disaggregation-mode: %w", err)
		}
		if role == workers.RolePrefill && bootstrapPort == 0 {
			bootstrapPort = 8998 // SGLang's default
		}
		return role, bootstrapPort, nil
	}
	role, err := workers.RoleFromKVTransferConfig(kvTransferConfig)
	if err != nil {
		return "", 0, fmt.Errorf("--kv-transfer-config: %w", err)
	}
	return role, bootstrapPort, nil
}

func runBridge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newFlags("kvrouter bridge", bridgeAbout)
	c.SetOutput(stderr)
	c.helpOut = stdout
	nf := addNATSFlags(c, false)
	lf := addLogFlags(c)
	var (
		engineURL  = c.str("engine-url", "http://127.0.0.1:8000", "the engine's HTTP base URL; registered as the worker's endpoint exactly as given unless --advertise-addr is set")
		advertise  = c.str("advertise-addr", "", "the engine's host:port as gateways and Envoy see it (on Kubernetes: $(POD_IP):<engine port>, POD_IP from the downward API's status.podIP); registered with --engine-url's scheme and path (\"\" = --engine-url)")
		kvEvents   = c.str("kv-events", "tcp://127.0.0.1:5557", "the engine's KV event PUB endpoint for rank 0 (its --kv-events-config endpoint, with a host to connect to)")
		kvReplay   = c.str("kv-replay", "tcp://127.0.0.1:5558", "the engine's replay endpoint for rank 0 (\"\" = none: every gap is a resync)")
		topic      = c.str("topic", "", "topic of the engine's events (its --kv-events-config topic; \"\" = every topic)")
		model      = c.str("model", "", "model the worker serves, as routers name it (required)")
		workerID   = c.str("worker-id", "", "worker id, unique in the fleet (\"\" = <host name>-<engine port>, stable across bridge restarts)")
		dp         = c.integer("data-parallel-size", 1, "data-parallel ranks of the engine: one event subscription and one worker rank each")
		dpOffset   = c.integer("dp-port-offset", 1, "port step between ranks: rank r's endpoints are the rank-0 ports + r x this (vLLM and SGLang use 1)")
		format     = c.str("engine-format", bridge.FormatVLLM, "engine kind, for its metric names: vllm or sglang")
		blockSize  = c.integer("block-size", 0, "the engine's KV block size in tokens (0 = read vllm:cache_config_info; required for SGLang: its --page-size)")
		routerBS   = c.integer("router-block-size", host.DefaultBlockSize, "the block size the routers of --model use (their --block-size); a different engine block size is a startup error")
		kvBlocks   = c.integer("kv-blocks", 0, "capacity in blocks per rank (0 = the engine's num_gpu_blocks, or SGLang's max_total_num_tokens / block size)")
		maxBatched = c.integer("max-num-batched-tokens", bridge.DefaultMaxBatchedTokens, "the engine's token budget per step (registered for load prediction)")
		maxSeqs    = c.integer("max-num-seqs", bridge.DefaultMaxSeqs, "the engine's running requests per rank (registered for load prediction)")
		interval   = c.duration("metrics-interval", bridge.DefaultMetricsInterval, "period of /metrics scrapes and load reports")
		stale      = c.integer("stale-intervals", bridge.DefaultStaleIntervals, "a scrape older than this many intervals makes the worker unavailable")
		health     = c.duration("health-interval", bridge.DefaultHealthInterval, "period of the engine's /health check")
		healthFail = c.integer("health-failures", bridge.DefaultHealthFailures, "failed /health checks in a row that make the worker unavailable")
		replayTO   = c.duration("replay-timeout", bridge.DefaultReplayTimeout, "longest wait for one replay answer (then the rank is resynced)")
		httpAddr   = c.str("http-addr", ":9090", "listen address of the bridge's /healthz, /readyz and /metrics (\"\" = none)")
		engKeyed   = c.boolean("engine-keyed", false, "publish engine-keyed event batches (wire version 1) instead of sequence-keyed ones (version 2): only while some routers of --model run a release from before sequence-keyed batches, which refuse version 2; upgrade the routers first, then drop this flag")
	)
	pd := addBridgePDFlags(c)
	ws := addWorkerSideFlags(c, 500*time.Microsecond, "the engine's requests in flight")
	if err := c.parse(args); err != nil {
		if helpRequested(err) {
			return err
		}
		return usageError{err}
	}
	id, err := bridgeIdentity(*model, *workerID, *engineURL)
	if err != nil {
		return usageError{err}
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return usageError{err}
	}
	role, bport, err := pd.role()
	if err != nil {
		return usageError{err}
	}
	cfg := bridge.Config{
		Role: role, BootstrapPort: bport,
		EngineURL: *engineURL, Advertise: *advertise, KVEvents: *kvEvents, KVReplay: *kvReplay, Topic: *topic, Model: *model, WorkerID: id,
		DataParallelSize: *dp, DPPortOffset: *dpOffset, EngineFormat: *format, BlockSize: *blockSize,
		RouterBlockSize: *routerBS, KVBlocks: *kvBlocks, MaxBatchedTokens: *maxBatched, MaxSeqs: *maxSeqs,
		MetricsInterval: *interval, StaleIntervals: *stale, HealthInterval: *health, HealthFailures: *healthFail, ReplayTimeout: *replayTO,
		Prefix: *ws.prefix, Events: kvevents.PublisherConfig{MaxDelay: *ws.maxDelay}, EngineKeyed: *engKeyed,
		Registry:  ws.registry(log),
		DrainWait: *ws.drain, Logger: log,
	}
	nc, js, err := ws.connect(ctx, nf, "kvrouter-bridge", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	b, err := bridge.New(cfg, nc.Conn, js)
	if err != nil {
		return usageError{err}
	}
	if *httpAddr != "" {
		ln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			return fmt.Errorf("--http-addr: %w", err)
		}
		srv := &http.Server{Handler: b.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		fmt.Fprintf(stdout, "bridge %s: /healthz /readyz /metrics on http://%s\n", id, ln.Addr())
	}
	fmt.Fprintf(stdout, "bridge %s: engine %s, events %s, model %q, NATS %s\n", id, *engineURL, *kvEvents, *model, nc.Where())
	return b.Run(ctx)
}

// bridgeIdentity checks that --model is given and returns the worker id:
// --worker-id, or by default defaultWorkerID.
func bridgeIdentity(model, workerID, engineURL string) (string, error) {
	if model == "" {
		return "", errors.New("--model is required")
	}
	if workerID != "" {
		return workerID, nil
	}
	return defaultWorkerID(engineURL)
}

// defaultWorkerID is <host name>-<engine port>: stable across restarts of
// the bridge, and distinct for several engines on one host.
func defaultWorkerID(engineURL string) (string, error) {
	u, err := url.Parse(engineURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("--engine-url %q: want http://host:port", engineURL)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "bridge"
	}
	return strings.ReplaceAll(h, ".", "-") + "-" + port, nil
}
