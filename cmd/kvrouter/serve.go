package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/internal/telemetry"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workers"
	"go.yaml.in/yaml/v3"
)

const serveAbout = `Run one router replica. It consumes the KV event stream into its prefix index,
watches the worker registry and load reports, and answers route requests on
NATS (<prefix>.route.<model>, queue group: run as many replicas as you like)
and HTTP (POST /v1/route and the other endpoints of docs/protocol.md).

It is ready (GET /readyz = 200, queue group joined) once it has caught up
with the event stream. SIGINT/SIGTERM stop it gracefully: it leaves the queue
group, finishes in-flight requests and binding commits, and flushes.

Policy file (--policy-file, YAML):
  policy:                  # the selection policy and its parameters
    name: default          # default, round-robin, random, least-loaded,
    params:                # power-of-two, two-tier, pipeline
      temperature: 0
  scheduler:               # queue, thresholds, booking (router/scheduler Config)
    thresholds: {queue_prefill_frac: 2.0, queue_decode_frac: 1.0}
    queue: {order: fcfs, default: {requests: 10000}}`

// policyFile is the YAML of --policy-file.
type policyFile struct {
	Policy    scheduler.PolicyConfig `yaml:"policy"`
	Scheduler yaml.Node              `yaml:"scheduler"`
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newFlags("kvrouter serve", serveAbout)
	c.SetOutput(stderr)
	c.helpOut = stdout
	nf := addNATSFlags(c, false)
	lf := addLogFlags(c)
	var (
		replicaID   = c.str("replica-id", "", "name of this replica in bindings, booking sync and logs (\"\" = random)")
		prefix      = c.str("prefix", api.DefaultPrefix, "first token of every NATS subject")
		models      = c.str("models", "default", "models this replica routes, comma separated")
		blockSize   = c.integer("block-size", host.DefaultBlockSize, "KV block size in tokens (must match the workers')")
		httpAddr    = c.str("http-addr", ":8080", "HTTP API listen address (\"\" = no HTTP)")
		openaiAddr  = c.str("openai-addr", "", "also run the OpenAI-compatible gateway (as 'kvrouter gateway') in this process on this address, calling this replica directly (\"\" = off)")
		openaiTok   = addTokenizerFlag(c, "openai-tokenizer")
		queueGroup  = c.str("queue-group", api.DefaultQueueGroup, "NATS queue group shared by the replicas of one deployment")
		stream      = c.str("event-stream", "KVR_EVENTS", "JetStream stream of KV events (created if missing)")
		maxAge      = c.duration("event-max-age", host.DefaultEventMaxAge, "how long the event stream keeps events (when this replica creates it)")
		replicas    = c.integer("stream-replicas", 1, "replicas of the streams and buckets this replica creates (3 in a production cluster)")
		policy      = c.str("policy", host.DefaultPolicy, "selection policy: default, round-robin, random, least-loaded, power-of-two, two-tier")
		policyFileF = c.str("policy-file", "", "YAML file with the policy, its parameters and the scheduler's queue and thresholds (overrides --policy)")
		sessionMode = c.str("session-mode", "hard", "mode of new session bindings: hard (a session stays on its worker while it lives) or soft (preferred)")
		sessionTTL  = c.duration("session-ttl", bindings.DefaultIdleTTL, "idle time after which a session binding expires")
		strict      = c.boolean("strict-reads", false, "read bindings from the stream leader on every request (no local cache)")
		bindBucket  = c.str("bindings-bucket", bindings.DefaultBucket, "KV bucket of session bindings")
		regBucket   = c.str("registry-bucket", workers.DefaultBucket, "KV bucket of the worker registry")
		snapBucket  = c.str("snapshot-bucket", host.DefaultSnapshotBucket, "object store bucket of index snapshots")
		snapEvery   = c.duration("snapshot-interval", 5*time.Minute, "how often to write an index snapshot (0 = never)")
		loadSnap    = c.boolean("load-snapshot", true, "start from the newest index snapshot and replay events from there")
		predicted   = c.duration("predicted-ttl", host.DefaultPredictedTTL, "how long the predicted index remembers routing decisions, this replica's and its peers' (negative = off)")
		approximate = c.boolean("approximate", false, "approximate mode, for engines that publish no KV events: no event subscription, the index holds this deployment's own routing decisions for --approx-ttl (snapshot flags are ignored)")
		approxTTL   = c.duration("approx-ttl", host.DefaultApproxTTL, "how long approximate mode counts a routed prefix as cached on its worker")
		deadline    = c.duration("queue-deadline", host.DefaultDeadline, "longest wait of a request in the router queue when it gives no deadline_ms")
		inflight    = c.integer("max-in-flight", host.DefaultMaxInFlight, "route requests handled at once over NATS; beyond, 529 at once")
		syncEvery   = c.duration("booking-sync-interval", host.DefaultBookingSyncInterval, "longest delay before a booking change is published to the other replicas")
		traceFile   = c.str("trace-file", "", "write OpenTelemetry spans as JSON lines to this file (\"\" = no tracing)")
		traceRatio  = c.float("trace-sample", 1, "fraction of routes traced when --trace-file is set (parent decisions are honoured)")
	)
	// Departures (issue 15): a worker whose key vanished is suspect, not departed, for this long.
	departureGrace := c.duration("departure-grace", workers.DefaultDepartureGrace,
		"how long a worker whose registry key expired may re-register before its departure is confirmed and its Hard sessions re-bind (negative = none)")
	if err := c.parse(args); err != nil {
		if helpRequested(err) {
			return err
		}
		return usageError{err}
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return usageError{err}
	}
	if err := gateway.CheckTokenizer(*openaiTok); err != nil {
		return usageError{fmt.Errorf("--openai-tokenizer: %w", err)}
	}
	mode, err := bindings.ParseMode(*sessionMode)
	if err != nil {
		return usageError{fmt.Errorf("--session-mode: %w", err)}
	}
	cfg := host.Config{
		ReplicaID: *replicaID, Prefix: *prefix, Models: splitList(*models), BlockSize: *blockSize,
		QueueGroup: *queueGroup, EventStream: *stream, EventMaxAge: *maxAge, StreamReplicas: *replicas,
		Registry:         workers.RegistryConfig{Bucket: *regBucket},
		Bindings:         bindings.Config{Bucket: *bindBucket, DefaultMode: mode, IdleTTL: *sessionTTL, StrictReads: *strict},
		Policy:           scheduler.PolicyConfig{Name: *policy},
		SnapshotBucket:   *snapBucket,
		SnapshotInterval: *snapEvery,
		LoadSnapshot:     *loadSnap,
		PredictedTTL:     *predicted,
		Approximate:      *approximate,
		ApproxTTL:        *approxTTL,
		DefaultDeadline:  *deadline,
		MaxInFlight:      *inflight,
		HTTPAddr:         *httpAddr,
		Logger:           log,
	}
	cfg.BookingSyncInterval = *syncEvery
	cfg.Registry.DepartureGrace = *departureGrace
	if cfg.Approximate {
		// Snapshots hold event-fed indexes; approximate mode has none.
		cfg.SnapshotInterval, cfg.LoadSnapshot = 0, false
	}
	if *policyFileF != "" {
		if err := applyPolicyFile(&cfg, *policyFileF); err != nil {
			return usageError{err}
		}
	}

	prom, err := telemetry.NewPrometheus(true)
	if err != nil {
		return err
	}
	defer prom.Shutdown(context.Background())
	cfg.MetricsHandler = prom.Handler
	cfg.Telemetry.MeterProvider = prom.Provider
	if *traceFile != "" {
		tf, err := telemetry.OpenTraceFile(*traceFile, *traceRatio, "kvrouter")
		if err != nil {
			return err
		}
		defer tf.Shutdown(context.Background())
		cfg.Telemetry.TracerProvider = tf.Provider
	}

	nc, err := natsconn.Open(ctx, nf.config("kvrouter-serve"), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := host.New(nc.Conn, cfg)
	if err != nil {
		return usageError{err}
	}
	startErr := r.Start(ctx)
	var gw *gatewayServer
	if startErr == nil && *openaiAddr != "" {
		gw, startErr = startOpenAI(r, *openaiAddr, *openaiTok, cfg.Telemetry, log)
	}
	if startErr == nil {
		fmt.Fprintf(stdout, "kvrouter replica %s ready: models %v, NATS %s, HTTP %s, OpenAI %s\n", r.ID(), r.Models(), nc.Where(), orNone(r.HTTPAddr()), orNone(gw.where()))
		<-ctx.Done()
		log.Info("signal received: shutting down")
	}
	var gwErr error
	if gw != nil {
		gwErr = gw.stop(30 * time.Second) // requests in flight still need the replica
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	closeErr := errors.Join(gwErr, r.Close(sctx))
	if startErr != nil {
		return startErr
	}
	return closeErr
}

// startOpenAI runs the gateway in process over r (serve --openai-addr).
func startOpenAI(r *host.Replica, addr, tokenizer string, tel host.Telemetry, log *slog.Logger) (*gatewayServer, error) {
	g, err := gateway.New(gateway.Config{Router: gateway.ReplicaRouter{R: r}, Models: r.Models(), Tokenizer: tokenizer, Logger: log,
		Telemetry: tel})
	if err != nil {
		return nil, err
	}
	return startGatewayServer(g, addr, nil, log) // /metrics is on --http-addr
}

func applyPolicyFile(cfg *host.Config, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--policy-file: %w", err)
	}
	var pf policyFile
	if err := yaml.Unmarshal(data, &pf); err != nil {
		return fmt.Errorf("--policy-file %s: %w", path, err)
	}
	if pf.Policy.Name != "" {
		cfg.Policy = pf.Policy
	}
	if _, err := scheduler.NewRegistry().Build(cfg.Policy); err != nil {
		return fmt.Errorf("--policy-file %s: %w", path, err)
	}
	if pf.Scheduler.Kind != 0 {
		raw, err := yaml.Marshal(&pf.Scheduler)
		if err != nil {
			return fmt.Errorf("--policy-file %s: scheduler: %w", path, err)
		}
		sc, err := scheduler.LoadConfigYAML(raw)
		if err != nil {
			return fmt.Errorf("--policy-file %s: scheduler: %w", path, err)
		}
		cfg.Scheduler = sc
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "off"
	}
	return s
}
