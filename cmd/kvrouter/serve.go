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
	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/internal/telemetry"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/session"
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
    thresholds: {queue_prefill_frac: 8.0, queue_decode_frac: 1.0}
    queue: {order: fcfs, default: {requests: 10000}}`

// policyFile is the YAML of --policy-file.
type policyFile struct {
	Policy    scheduler.PolicyConfig `yaml:"policy"`
	Scheduler yaml.Node              `yaml:"scheduler"`
}

// runServe reads as its outline: parse the flags into a replica
// configuration, set up telemetry, connect to NATS, build the replica,
// then serve until ctx ends (serveUntilDone: start, optional in-process
// gateway, wait, graceful stop).
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newFlags("kvrouter serve", serveAbout)
	c.SetOutput(stderr)
	c.helpOut = stdout
	f := addServeFlags(c)
	if err := c.parse(args); err != nil {
		if helpRequested(err) {
			return err
		}
		return usageError{err}
	}
	log, err := f.log.logger(stderr)
	if err != nil {
		return usageError{err}
	}
	cfg, err := f.config(log)
	if err != nil {
		return usageError{err}
	}
	stopTelemetry, err := serveTelemetry(ctx, &cfg, f.trace, log)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	nc, err := natsconn.Open(ctx, f.nats.config("kvrouter-serve"), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := host.New(nc.Conn, cfg)
	if err != nil {
		return usageError{err}
	}
	return serveUntilDone(ctx, f, cfg, r, nc, stdout, log)
}

// serveFlags are the flags of kvrouter serve.
type serveFlags struct {
	nats *natsFlags
	log  *logFlags

	replicaID, prefix, models, httpAddr, openaiAddr, openaiTok, openaiPD, queueGroup, stream *string
	eppAddr                                                                                  *string
	policy, policyFile, sessionMode, bindBucket, regBucket, snapBucket                       *string
	blockSize, replicas, maxSessions, inflight                                               *int
	maxAge, sessionTTL, bindStale, snapEvery, predicted, approxTTL, deadline                 *time.Duration
	syncEvery                                                                                *time.Duration
	strict, loadSnap, approximate                                                            *bool
	trace                                                                                    traceFlags

	// The bounded index and the events it takes (host.IndexLimits).
	idxBytes, idxEntries, idxPerWorker *int
	holdGrace                          *time.Duration

	http   *serveHTTPFlags
	limits streamLimitFlags
	// Departures (issue 15): a worker whose key vanished is suspect, not departed, for this long.
	departureGrace *time.Duration
	pdSingle       *int
	pdLocal        *bool
}

func addServeFlags(c *cmdFlags) *serveFlags {
	return &serveFlags{
		nats:        addNATSFlags(c, false),
		log:         addLogFlags(c),
		replicaID:   c.str("replica-id", "", "name of this replica in bindings, booking sync and logs (\"\" = random)"),
		prefix:      c.str("prefix", api.DefaultPrefix, "first token of every NATS subject"),
		models:      c.str("models", "default", "models this replica routes, comma separated"),
		blockSize:   c.integer("block-size", host.DefaultBlockSize, "KV block size in tokens (must match the workers')"),
		httpAddr:    c.str("http-addr", "127.0.0.1:8080", "HTTP API listen address (\"\" = no HTTP); loopback by default: give :8080 or a host address to open it, with --http-token"),
		openaiAddr:  c.str("openai-addr", "", "also run the OpenAI-compatible gateway (as 'kvrouter gateway') in this process on this address, calling this replica directly (\"\" = off)"),
		openaiTok:   addTokenizerFlag(c, "openai-tokenizer"),
		openaiPD:    c.str("openai-pd", "", "the --openai-addr gateway's prefill/decode disaggregation, as 'kvrouter gateway --pd': vllm or sglang (\"\" = off; docs/pd.md)"),
		eppAddr:     c.str("epp-addr", "", "also run the Gateway API endpoint picker (as 'kvrouter epp': Envoy ext_proc and gRPC health) in this process on this address, calling this replica directly; it reads prompts as --openai-tokenizer says (\"\" = off)"),
		queueGroup:  c.str("queue-group", api.DefaultQueueGroup, "NATS queue group shared by the replicas of one deployment"),
		stream:      c.str("event-stream", "KVR_EVENTS", "JetStream stream of KV events (created if missing, else verified)"),
		maxAge:      c.duration("event-max-age", host.DefaultEventMaxAge, "how long the event stream keeps events"),
		replicas:    c.integer("stream-replicas", 1, "replicas of the streams and buckets this replica creates and verifies (3 in a production cluster)"),
		policy:      c.str("policy", host.DefaultPolicy, "selection policy: default, round-robin, random, least-loaded, power-of-two, two-tier"),
		policyFile:  c.str("policy-file", "", "YAML file with the policy, its parameters and the scheduler's queue and thresholds (overrides --policy)"),
		sessionMode: c.str("session-mode", "hard", "mode of new session bindings: hard (a session stays on its worker while it lives) or soft (preferred)"),
		sessionTTL:  c.duration("session-ttl", bindings.DefaultIdleTTL, "how long a session binding lives at least after the session's last request (it is stored for 1.5x this, so it goes between 1x and 1.5x after)"),
		strict:      c.boolean("strict-reads", false, "read every session binding from the stream leader (no local cache); without it Hard bindings are read from the leader anyway and Soft ones lag at most --bindings-max-staleness"),
		bindStale:   c.duration("bindings-max-staleness", bindings.DefaultMaxStaleness, "how far a Soft session binding read from the local cache may lag the bucket (40ms..1s); Hard bindings are always read from the stream leader"),
		maxSessions: c.integer("max-sessions", bindings.DefaultMaxSessions, "most session bindings stored (with the markers of ended or expired ones, for a minute); new sessions past it get 529 overloaded (negative = unbounded)"),
		bindBucket:  c.str("bindings-bucket", bindings.DefaultBucket, "KV bucket of session bindings"),
		regBucket:   c.str("registry-bucket", workers.DefaultBucket, "KV bucket of the worker registry"),
		snapBucket:  c.str("snapshot-bucket", host.DefaultSnapshotBucket, "object store bucket of index snapshots"),
		snapEvery:   c.duration("snapshot-interval", 5*time.Minute, "how often to write an index snapshot (0 = never)"),
		loadSnap:    c.boolean("load-snapshot", true, "start from the newest index snapshot and replay events from there"),
		predicted:   c.duration("predicted-ttl", host.DefaultPredictedTTL, "how long the predicted index remembers routing decisions, this replica's and its peers' (negative = off)"),
		approximate: c.boolean("approximate", false, "approximate mode, for engines that publish no KV events: no event subscription, the index holds this deployment's own routing decisions for --approx-ttl (snapshot flags are ignored)"),
		approxTTL:   c.duration("approx-ttl", host.DefaultApproxTTL, "how long approximate mode counts a routed prefix as cached on its worker"),
		deadline:    c.duration("queue-deadline", host.DefaultDeadline, "longest a route may take when the request gives no deadline_ms: the queue wait, and a session's binding read and commit (then 503 bindings_unavailable)"),
		inflight:    c.integer("max-in-flight", host.DefaultMaxInFlight, "route requests handled at once over NATS and HTTP together; beyond, 529 at once"),
		syncEvery:   c.duration("booking-sync-interval", host.DefaultBookingSyncInterval, "longest delay before a booking change is published to the other replicas"),
		trace:       addTraceFlags(c, "routes"),

		idxBytes:     c.integer("index-max-bytes", 0, "memory budget of the prefix index, all models together, in bytes (0 = a quarter of the memory limit: cgroup, GOMEMLIMIT or physical memory; -1 = no cap)"),
		idxEntries:   c.integer("index-max-entries", 0, "cap on (block, worker) entries of each model's index, instead of one derived from --index-max-bytes (0 = derived; -1 = no cap)"),
		idxPerWorker: c.integer("index-max-entries-per-worker", 0, "cap on one worker rank's index entries (0 = 1/8 of the model's cap; -1 = none); each rank is also capped at twice the kv_blocks it registered"),
		holdGrace:    c.duration("event-hold-grace", host.DefaultEventHoldGrace, "how long events of a worker not yet in the registry wait for its registration before they are dropped (negative = drop at once)"),

		http:   addServeHTTPFlags(c),
		limits: addStreamLimitFlags(c),
		departureGrace: c.duration("departure-grace", workers.DefaultDepartureGrace,
			"how long a worker whose registry key expired may re-register before its departure is confirmed and its Hard sessions re-bind (negative = none)"),
		pdSingle: c.integer("pd-single-max-tokens", host.DefaultPDSingleMaxTokens,
			"a route asking for a prefill/decode pair goes to one `both` worker when at most this many prompt tokens are uncached there (negative = always split; docs/pd.md)"),
		pdLocal: c.boolean("pd-local-prefill", true,
			"when every prefill worker is busy, a decode worker with room prefills the request itself instead of the pair waiting (Dynamo's conditional disaggregation; false for SGLang decode servers, which cannot serve whole requests; docs/pd.md)"),
	}
}

// config is the replica configuration the flags give (errors are usage
// errors: they name the flag).
func (f *serveFlags) config(log *slog.Logger) (host.Config, error) {
	if err := gateway.CheckTokenizer(*f.openaiTok); err != nil {
		return host.Config{}, fmt.Errorf("--openai-tokenizer: %w", err)
	}
	if err := gateway.CheckPD(*f.openaiPD); err != nil {
		return host.Config{}, fmt.Errorf("--openai-pd: %w", err)
	}
	mode, err := session.ParseMode(*f.sessionMode)
	if err != nil {
		return host.Config{}, fmt.Errorf("--session-mode: %w", err)
	}
	cfg := host.Config{
		ReplicaID: *f.replicaID, Prefix: *f.prefix, Models: splitList(*f.models), BlockSize: *f.blockSize,
		QueueGroup: *f.queueGroup, EventStream: *f.stream, EventMaxAge: *f.maxAge, StreamReplicas: *f.replicas,
		Registry: workers.RegistryConfig{Bucket: *f.regBucket},
		Bindings: bindings.Config{Bucket: *f.bindBucket, DefaultMode: mode, IdleTTL: *f.sessionTTL, StrictReads: *f.strict,
			MaxStaleness: *f.bindStale, MaxSessions: int64(*f.maxSessions)},
		Policy:           scheduler.PolicyConfig{Name: *f.policy},
		SnapshotBucket:   *f.snapBucket,
		SnapshotInterval: *f.snapEvery,
		LoadSnapshot:     *f.loadSnap,
		PredictedTTL:     *f.predicted,
		Approximate:      *f.approximate,
		ApproxTTL:        *f.approxTTL,
		DefaultDeadline:  *f.deadline,
		MaxInFlight:      *f.inflight,
		HTTPAddr:         *f.httpAddr,
		Logger:           log,
	}
	cfg.BookingSyncInterval = *f.syncEvery
	cfg.IndexLimits = host.IndexLimits{MaxBytes: int64(*f.idxBytes), MaxEntries: int64(*f.idxEntries),
		MaxEntriesPerWorker: int64(*f.idxPerWorker), EventHoldGrace: *f.holdGrace}
	if err := f.http.apply(&cfg); err != nil {
		return host.Config{}, err
	}
	f.limits.apply(&cfg)
	cfg.Registry.DepartureGrace = *f.departureGrace
	cfg.PDSingleMaxTokens = *f.pdSingle
	// SGLang's decode servers cannot serve a whole request: the in-process
	// SGLang gateway never gets one from the local prefill rule.
	cfg.PDNoLocalPrefill = !*f.pdLocal || *f.openaiPD == gateway.PDSGLang
	if cfg.Approximate {
		// Snapshots hold event-fed indexes; approximate mode has none.
		cfg.SnapshotInterval, cfg.LoadSnapshot = 0, false
	}
	if *f.policyFile != "" {
		if err := applyPolicyFile(&cfg, *f.policyFile); err != nil {
			return host.Config{}, err
		}
	}
	return cfg, nil
}

// serveTelemetry sets up the Prometheus exporter behind /metrics and the
// span exporters the trace flags ask for; stop shuts them down.
func serveTelemetry(ctx context.Context, cfg *host.Config, tf traceFlags, log *slog.Logger) (stop func(), err error) {
	prom, err := telemetry.NewPrometheus(true)
	if err != nil {
		return nil, err
	}
	cfg.MetricsHandler = prom.Handler
	cfg.Telemetry.MeterProvider = prom.Provider
	tracing, err := tf.start(ctx, "kvrouter", log)
	if err != nil {
		prom.Shutdown(context.Background())
		return nil, err
	}
	cfg.Telemetry.TracerProvider = tracing.TracerProvider()
	return func() {
		tracing.Shutdown(context.Background())
		prom.Shutdown(context.Background())
	}, nil
}

// serveUntilDone starts r (and the in-process gateway with
// --openai-addr, the endpoint picker with --epp-addr), serves until ctx
// ends, then stops them gracefully. A start error wins over a stop error.
func serveUntilDone(ctx context.Context, f *serveFlags, cfg host.Config, r *host.Replica, nc *natsconn.Conn, stdout io.Writer, log *slog.Logger) error {
	startErr := r.Start(ctx)
	var gw *gatewayServer
	if startErr == nil && *f.openaiAddr != "" {
		gw, startErr = startOpenAI(r, *f.openaiAddr, *f.openaiTok, *f.openaiPD, cfg.HTTPToken, cfg.Telemetry, log)
	}
	var ep *eppServer
	if startErr == nil && *f.eppAddr != "" {
		ep, startErr = startReplicaEPP(r, *f.eppAddr, *f.openaiTok, cfg.Telemetry, log)
	}
	if startErr == nil {
		fmt.Fprintf(stdout, "kvrouter replica %s ready: models %v, NATS %s, HTTP %s, OpenAI %s, EPP %s\n", r.ID(), r.Models(), nc.Where(),
			orNone(r.HTTPAddr()), orNone(gw.where()), orNone(ep.where()))
		<-ctx.Done()
		log.Info("signal received: shutting down")
	}
	var gwErr error
	if ep != nil {
		ep.stop(30 * time.Second) // streams in flight still need the replica
	}
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

// startReplicaEPP runs the endpoint picker in process over r (serve
// --epp-addr): ready while the replica is (caught up with the event
// stream).
func startReplicaEPP(r *host.Replica, addr, tokenizer string, tel host.Telemetry, log *slog.Logger) (*eppServer, error) {
	g, err := gateway.New(gateway.Config{Router: gateway.ReplicaRouter{R: r}, Models: r.Models(), Tokenizer: tokenizer, Logger: log, Telemetry: tel})
	if err != nil {
		return nil, err
	}
	return startEPP(epp.Config{Gateway: g, Ready: r.IsReady, Logger: log, Telemetry: tel}, addr, log)
}

// startOpenAI runs the gateway in process over r (serve --openai-addr),
// guarded by the replica's --http-token as its API key.
func startOpenAI(r *host.Replica, addr, tokenizer, pd, apiKey string, tel host.Telemetry, log *slog.Logger) (*gatewayServer, error) {
	g, err := gateway.New(gateway.Config{Router: gateway.ReplicaRouter{R: r}, Models: r.Models(), Tokenizer: tokenizer, PD: pd,
		Logger: log, Telemetry: tel, APIKey: apiKey})
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

// serveHTTPFlags are the HTTP API's access and bounds (docs/protocol.md,
// "HTTP API").
type serveHTTPFlags struct {
	token, tokenFile           *string
	metricsOpen, allowUnfenced *bool
	readTimeout, writeTimeout  *time.Duration
	forwardTimeout             *time.Duration
	maxBody, forwardConc       *int
}

func addServeHTTPFlags(c *cmdFlags) *serveHTTPFlags {
	return &serveHTTPFlags{
		token:          c.str("http-token", "", "bearer token the HTTP route, lifecycle, workers and sessions calls must send (\"Authorization: Bearer <token>\"; also the API key of --openai-addr); \"\" = none"),
		tokenFile:      c.str("http-token-file", "", "file holding --http-token (kept out of the process list)"),
		metricsOpen:    c.boolean("metrics-open", false, "serve /metrics without the token (/healthz and /readyz never need it)"),
		readTimeout:    c.duration("http-read-timeout", host.DefaultHTTPReadTimeout, "longest read of one HTTP request, body included (headers: 10 s)"),
		writeTimeout:   c.duration("http-write-timeout", host.DefaultHTTPWriteTimeout, "longest write of one HTTP reply, from when it is ready"),
		maxBody:        c.integer("route-max-body-bytes", 0, "largest route request body, HTTP or NATS (0 = sized to the largest prompt a registered worker can hold, 1 MiB to 16 MiB)"),
		forwardConc:    c.integer("forward-concurrency", host.DefaultForwardConcurrency, "lifecycle calls forwarded to other replicas at once; beyond, 529 at once"),
		forwardTimeout: c.duration("forward-timeout", host.DefaultForwardTimeout, "longest lifecycle call forwarded to another replica"),
		allowUnfenced:  c.boolean("lifecycle-allow-unfenced", false, "accept lifecycle calls without the booking's fence or request key (for callers that do not pass them yet; anyone who knows a request id can then free or cancel it)"),
	}
}

func (f *serveHTTPFlags) apply(cfg *host.Config) error {
	token, err := secret("http-token", *f.token, "http-token-file", *f.tokenFile)
	if err != nil {
		return err
	}
	cfg.HTTPToken, cfg.MetricsOpen, cfg.AllowUnfencedLifecycle = token, *f.metricsOpen, *f.allowUnfenced
	cfg.HTTPReadTimeout, cfg.HTTPWriteTimeout = *f.readTimeout, *f.writeTimeout
	cfg.MaxBodyBytes, cfg.ForwardConcurrency, cfg.ForwardTimeout = int64(*f.maxBody), *f.forwardConc, *f.forwardTimeout
	return nil
}

// streamLimitFlags are the limits of the event stream and the buckets
// this replica creates, and whether it updates existing ones that differ
// (docs/protocol.md, "Streams and buckets").
type streamLimitFlags struct {
	eventMaxBytes, registryMaxBytes, bindingsMaxBytes *int
	update                                            *bool
}

func addStreamLimitFlags(c *cmdFlags) streamLimitFlags {
	return streamLimitFlags{
		eventMaxBytes:    c.integer("event-max-bytes", int(host.DefaultEventMaxBytes), "largest size of the event stream in bytes; the oldest events go first (-1 = unlimited)"),
		registryMaxBytes: c.integer("registry-max-bytes", int(host.DefaultRegistryMaxBytes), "largest size of the worker registry bucket in bytes; when full, new registrations fail (-1 = unlimited)"),
		bindingsMaxBytes: c.integer("bindings-max-bytes", int(host.DefaultBindingsMaxBytes), "largest size of the session bindings bucket in bytes; when full, binding writes fail (-1 = unlimited)"),
		update:           c.boolean("update-streams", false, "update an existing event stream or bucket whose replicas or limits differ from these flags (default: log a warning per difference and change nothing)"),
	}
}

func (f streamLimitFlags) apply(cfg *host.Config) {
	cfg.EventMaxBytes, cfg.RegistryMaxBytes, cfg.BindingsMaxBytes = int64(*f.eventMaxBytes), int64(*f.registryMaxBytes), int64(*f.bindingsMaxBytes)
	cfg.UpdateStreams = *f.update
}
