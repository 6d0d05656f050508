package host

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/nats-io/nuid"
)

// Config configures a Replica. Zero values take the defaults named on each
// field; Models is the only required field.
type Config struct {
	// ReplicaID names this replica in booking sync, binding values,
	// lifecycle addressing and logs. Default: "r-" + a random id.
	ReplicaID string
	// Prefix is the first token of every subject (default "kvr").
	Prefix string
	// Models are the models this replica routes (at least one). Each gets
	// its own prefix index, scheduler and route subject.
	Models []string
	// BlockSize is the KV block size in tokens used until a worker of the
	// model registers its own (default 16). Workers of one model must agree.
	BlockSize int
	// QueueGroup is the NATS queue group of the route API (default
	// "kvr-router"): replicas sharing it split the requests.
	QueueGroup string

	// EventStream is the JetStream stream of KV events (default
	// "KVR_EVENTS"); created when missing with EventMaxAge and
	// StreamReplicas.
	EventStream    string
	EventMaxAge    time.Duration // default 1 h
	StreamReplicas int           // replicas of streams and buckets this replica creates (default 1)
	// EventMaxBytes, RegistryMaxBytes and BindingsMaxBytes bound the event
	// stream and the registry and bindings buckets this replica creates
	// (0: DefaultEventMaxBytes, DefaultRegistryMaxBytes,
	// DefaultBindingsMaxBytes; negative: unlimited). The replica owns the
	// configuration of the streams and buckets it uses: at start it
	// verifies existing ones against it and logs a warning per difference,
	// or, with UpdateStreams, updates them (storage.go).
	EventMaxBytes    int64
	RegistryMaxBytes int64
	BindingsMaxBytes int64
	UpdateStreams    bool

	// Registry configures the worker registry watch (bucket "kvr-workers").
	Registry workers.RegistryConfig
	// Bindings configures the session bindings table (bucket
	// "kvr-bindings", default mode Hard, idle TTL 10 min). ReplicaID,
	// Liveness and Logger are filled in by the replica.
	Bindings bindings.Config
	// Scheduler is the template of every model's scheduler configuration
	// (Model, Replica, BlockSize and OnBookingChange are set per model).
	Scheduler scheduler.Config
	// Policy names the selection policy and its parameters (default
	// "default", the cost function of the scheduler issue). Each model gets
	// its own instance built by PolicyRegistry (default
	// scheduler.NewRegistry(), the builtins).
	Policy         scheduler.PolicyConfig
	PolicyRegistry *scheduler.Registry

	// SnapshotBucket is the object store bucket of index snapshots (default
	// "kvr-index-snapshots"). SnapshotInterval is how often this replica writes
	// one (0 = never); LoadSnapshot makes the replica start from the newest
	// snapshot and replay the stream from there instead of from the start.
	SnapshotBucket   string
	SnapshotInterval time.Duration
	LoadSnapshot     bool

	// PredictedTTL is how long the predicted index remembers this replica's
	// own routing decisions, covering the time before the chosen worker's
	// Stored events arrive (default 5 s; negative = off).
	PredictedTTL time.Duration

	// Approximate is the mode for engines that publish no KV events: the
	// replica does not subscribe to the event stream (it still creates and
	// verifies it: workers publish to it; it loads and writes no index
	// snapshots) and its index is an approximate one
	// fed by routing decisions, each remembered for ApproxTTL (default
	// 120 s) up to ApproxMaxBlocks (block, worker) entries (default 2^20,
	// pruned to 80 % of that when reached). Readiness then waits only for
	// membership. PredictedTTL is unused: the approximate index already
	// holds the decisions.
	Approximate     bool
	ApproxTTL       time.Duration
	ApproxMaxBlocks int

	// PDSingleMaxTokens is the single-worker rule of a route that asks for
	// a prefill/decode pair (pd.go, docs/pd.md): when the decode worker
	// chosen is a `both` worker and at most this many prompt tokens are
	// uncached there, it serves the whole request (default 512; negative:
	// always split when a prefill worker is available).
	PDSingleMaxTokens int
	// PDNoLocalPrefill turns off the local prefill rule of a PD route
	// (pd.go, docs/pd.md): when every prefill worker is busy (the prefill
	// leg would wait in the queue) and a decode-capable worker has room for
	// the prompt's prefill by the queue threshold, that worker serves the
	// whole request instead of the pair waiting. Dynamo's disaggregated
	// router does the same (a long prefill queue makes the decode worker
	// prefill locally). Set it for decode workers that cannot serve a
	// whole request (SGLang's decode servers).
	PDNoLocalPrefill bool

	// DefaultDeadline bounds a route when the request gives no
	// deadline_ms (default 30 s): its wait in the scheduler queue and, for
	// a session, the binding read and commit (route.go).
	DefaultDeadline time.Duration
	// MaxInFlight bounds the route requests handled at once, over NATS and
	// HTTP together (default 8192); past it requests are answered 529 at
	// once.
	MaxInFlight int

	// BookingSyncInterval is the longest a booking change waits before it
	// is published to the other replicas (default 2 ms); BookingSyncBuffer
	// bounds the changes waiting (default 65,536; past it changes are
	// dropped and counted, and the workers' load reports correct the
	// drift).
	BookingSyncInterval time.Duration
	BookingSyncBuffer   int

	// DecisionSyncBuffer bounds this replica's routing decisions waiting to
	// be shared with the other replicas on <prefix>.decisions.<model>, for
	// their predicted (or approximate) index (default 4,096; past it
	// decisions are dropped and counted, never waited for; negative = do
	// not share, and ignore the peers'). Batched like booking sync, for at
	// most BookingSyncInterval.
	DecisionSyncBuffer int

	// HTTPAddr, when set, serves the HTTP API there (":8080"). Handler()
	// serves the same API for callers that run their own server.
	HTTPAddr string
	// MetricsHandler serves GET /metrics (for example the Handler of
	// internal/telemetry.NewPrometheus).
	MetricsHandler http.Handler

	// HTTP access and bounds (see docs/protocol.md, "HTTP API").
	//
	// HTTPToken, when set, is the bearer token every route, lifecycle,
	// workers and sessions call must present ("Authorization: Bearer
	// <token>", compared in constant time); a missing or wrong one is 401.
	// /healthz and /readyz never need it; /metrics needs it unless
	// MetricsOpen.
	HTTPToken   string
	MetricsOpen bool
	// Server timeouts: the request headers (default 10 s), the whole
	// request with its body (default 30 s), writing a reply (default 30 s,
	// counted from when the reply is ready, so a request waiting in the
	// scheduler queue is not cut), and an idle keep-alive connection
	// (default 2 min); request headers are bounded by HTTPMaxHeaderBytes
	// (default 64 KiB).
	HTTPReadHeaderTimeout time.Duration
	HTTPReadTimeout       time.Duration
	HTTPWriteTimeout      time.Duration
	HTTPIdleTimeout       time.Duration
	HTTPMaxHeaderBytes    int
	// MaxBodyBytes bounds a route request body (HTTP body or NATS
	// payload). Default 0: sized to the largest prompt a registered worker
	// can hold (its KV blocks * block size tokens, 11 bytes per token id on
	// the wire), at least 1 MiB and at most api.MaxRouteBodySize.
	MaxBodyBytes int64
	// ForwardConcurrency bounds the lifecycle calls this replica forwards
	// to other replicas at once (default 256; past it a call is answered
	// 529 at once) and ForwardTimeout each one (default 5 s).
	ForwardConcurrency int
	ForwardTimeout     time.Duration
	// AllowUnfencedLifecycle accepts lifecycle calls that carry no fence
	// (the behaviour before fences, for callers not yet passing
	// RouteResponse.Fence, or a request key for a cancel while queued).
	// Off by default: such a call is a 400.
	AllowUnfencedLifecycle bool

	Telemetry Telemetry
	Logger    *slog.Logger

	// Bounded state: the prefix index and the events it takes (issue 16).
	IndexLimits IndexLimits
}

// IndexLimits bound the prefix index and what reaches it. Zero values take
// the defaults named on each field; normalize leaves the resolved values.
type IndexLimits struct {
	// MaxBytes is the memory budget of the prefix indexes of every model
	// together, split evenly between the models and turned into an entry
	// cap at IndexBytesPerEntry (default: DefaultIndexMemoryFraction of the
	// memory this process may use, see MemoryLimit; negative = no cap).
	MaxBytes int64
	// MaxEntries, when set, is each model's cap on (block, worker) entries
	// instead of one derived from MaxBytes (negative = no cap). Past it new
	// stores are refused and counted (kvr.index.refused_stores).
	MaxEntries int64
	// MaxEntriesPerWorker caps one (worker, rank) (default: MaxEntries /
	// DefaultIndexWorkerShare; negative = no cap). Below it, each rank is
	// also capped at IndexKVBlocksSlack times the kv_blocks its worker
	// registered: a worker cannot hold more than that, so one that floods
	// stored blocks stops at its own size and the others keep theirs.
	MaxEntriesPerWorker int64
	// EventHoldGrace is how long the event batches of a worker not (yet)
	// in the registry are held, waiting for its registration to arrive
	// (default 5 s; negative = drop them at once). At most EventHoldMax
	// batches (default 1,024) and 65,536 blocks are held in all; past the
	// grace or the bounds they are dropped. Counted in
	// kvr.events.unregistered by result.
	EventHoldGrace time.Duration
	EventHoldMax   int
}

// ErrConfig reports an unusable replica configuration.
var ErrConfig = errors.New("host: invalid config")

// Defaults.
const (
	DefaultSnapshotBucket      = index.DefaultSnapshotBucket
	DefaultPolicy              = "default"
	DefaultBlockSize           = 16
	DefaultPredictedTTL        = 5 * time.Second
	DefaultApproxTTL           = index.DefaultApproxTTL
	DefaultDeadline            = 30 * time.Second
	DefaultPDSingleMaxTokens   = 512
	DefaultMaxInFlight         = 8192
	DefaultBookingSyncInterval = 2 * time.Millisecond
	DefaultBookingSyncBuffer   = 65536
	DefaultDecisionSyncBuffer  = 4096
	DefaultEventMaxAge         = time.Hour

	// DefaultIndexMemoryFraction: the index budget is a quarter of the
	// memory the process may use, leaving the rest to the bindings cache,
	// the NATS client's buffers, requests in flight and the Go heap's
	// headroom (GOGC=100 lets the heap grow to twice what is live).
	DefaultIndexMemoryFraction = 4
	// DefaultIndexMaxBytesFallback is the budget when the memory limit
	// cannot be read (no cgroup limit, no /proc/meminfo).
	DefaultIndexMaxBytesFallback = 1 << 30
	// IndexBytesPerEntry turns a byte budget into an entry cap: the
	// worst case of BenchmarkMemoryPerEntry (66.6 B with every block on one
	// worker) at the lowest load factor of both hash tables just after
	// they grow (85 B), rounded up.
	IndexBytesPerEntry = 96
	// DefaultIndexWorkerShare: one (worker, rank) may take at most 1/8 of
	// its model's entries, so a flood needs eight misbehaving ranks to fill
	// the budget; a real rank, capped at twice its registered kv_blocks, is
	// far below that.
	DefaultIndexWorkerShare = 8
	// IndexKVBlocksSlack is how many times its registered kv_blocks a rank
	// may have indexed (slack for engines that report a block under two
	// hashes, or a removal that lags its store).
	IndexKVBlocksSlack           = 2
	DefaultEventHoldGrace        = 5 * time.Second
	DefaultEventHoldMax          = 1024
	DefaultHTTPReadHeaderTimeout = 10 * time.Second
	DefaultHTTPReadTimeout       = 30 * time.Second
	DefaultHTTPWriteTimeout      = 30 * time.Second
	DefaultHTTPIdleTimeout       = 2 * time.Minute
	DefaultHTTPMaxHeaderBytes    = 64 << 10
	MinBodyBytes                 = 1 << 20 // floor of the derived route body limit
	DefaultForwardConcurrency    = 256
	DefaultForwardTimeout        = 5 * time.Second
)

// normalize fills the defaults and checks the values, section by section
// in the order of the Config fields; the first unusable value is the
// error.
func (c *Config) normalize() error {
	if err := c.normalizeIdentity(); err != nil {
		return err
	}
	c.normalizeStreams()
	if err := c.normalizeIndexes(); err != nil {
		return err
	}
	if err := c.normalizeRouting(); err != nil {
		return err
	}
	c.IndexLimits.normalize(len(c.Models), MemoryLimit)
	if err := c.normalizeHTTP(); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Telemetry = c.Telemetry.WithDefaults()
	return nil
}

// normalizeIdentity fills and checks who the replica is and what it
// routes: its id, the subject prefix, the models and their block size.
func (c *Config) normalizeIdentity() error {
	if c.ReplicaID == "" {
		c.ReplicaID = "r-" + strings.ToLower(nuid.Next()[12:])
	}
	if len(c.ReplicaID) > api.MaxWorkerIDLen {
		return fmt.Errorf("%w: replica id %q longer than %d bytes", ErrConfig, c.ReplicaID, api.MaxWorkerIDLen)
	}
	c.Prefix = api.PrefixOrDefault(c.Prefix)
	if len(c.Models) == 0 {
		return fmt.Errorf("%w: no model to serve (Config.Models is empty)", ErrConfig)
	}
	seen := map[string]bool{}
	for _, m := range c.Models {
		if m == "" || len(m) > api.MaxModelLen {
			return fmt.Errorf("%w: model name %q (want 1..%d bytes)", ErrConfig, m, api.MaxModelLen)
		}
		if seen[m] {
			return fmt.Errorf("%w: model %q listed twice", ErrConfig, m)
		}
		seen[m] = true
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.BlockSize < 1 || c.BlockSize > api.MaxBlockSize {
		return fmt.Errorf("%w: block size %d (want 1..%d)", ErrConfig, c.BlockSize, api.MaxBlockSize)
	}
	return nil
}

// normalizeStreams fills the defaults of the queue group and the event
// stream.
func (c *Config) normalizeStreams() {
	if c.QueueGroup == "" {
		c.QueueGroup = api.DefaultQueueGroup
	}
	if c.EventStream == "" {
		c.EventStream = kvevents.DefaultStream
	}
	if c.EventMaxAge == 0 {
		c.EventMaxAge = DefaultEventMaxAge
	}
	if c.StreamReplicas == 0 {
		c.StreamReplicas = 1
	}
}

// normalizeIndexes fills and checks the snapshots, the predicted index and
// approximate mode (which has no event-fed index to snapshot).
func (c *Config) normalizeIndexes() error {
	if c.SnapshotBucket == "" {
		c.SnapshotBucket = DefaultSnapshotBucket
	}
	if c.SnapshotInterval < 0 {
		return fmt.Errorf("%w: snapshot interval %v is negative", ErrConfig, c.SnapshotInterval)
	}
	if c.PredictedTTL == 0 {
		c.PredictedTTL = DefaultPredictedTTL
	}
	if c.ApproxTTL == 0 {
		c.ApproxTTL = DefaultApproxTTL
	}
	if c.ApproxMaxBlocks == 0 {
		c.ApproxMaxBlocks = index.DefaultApproxMaxBlocks
	}
	if c.Approximate {
		if c.ApproxTTL < 0 || c.ApproxMaxBlocks < 0 {
			return fmt.Errorf("%w: approximate mode needs a positive TTL and size cap (ttl %v, max blocks %d)", ErrConfig, c.ApproxTTL, c.ApproxMaxBlocks)
		}
		if c.LoadSnapshot || c.SnapshotInterval > 0 {
			return fmt.Errorf("%w: index snapshots (load %v, interval %v) hold event-fed indexes; approximate mode has none", ErrConfig, c.LoadSnapshot, c.SnapshotInterval)
		}
	}
	return nil
}

// normalizeRouting fills and checks the policy, the route deadline, the
// in-flight cap and replica sync's interval and buffers.
func (c *Config) normalizeRouting() error {
	if c.Policy.Name == "" {
		c.Policy.Name = DefaultPolicy
	}
	if c.PolicyRegistry == nil {
		c.PolicyRegistry = scheduler.NewRegistry()
	}
	if c.PDSingleMaxTokens == 0 {
		c.PDSingleMaxTokens = DefaultPDSingleMaxTokens
	}
	if c.DefaultDeadline == 0 {
		c.DefaultDeadline = DefaultDeadline
	}
	if c.DefaultDeadline < 0 {
		return fmt.Errorf("%w: default deadline %v is negative", ErrConfig, c.DefaultDeadline)
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxInFlight < 1 {
		return fmt.Errorf("%w: max in flight %d", ErrConfig, c.MaxInFlight)
	}
	if c.BookingSyncInterval == 0 {
		c.BookingSyncInterval = DefaultBookingSyncInterval
	}
	if c.BookingSyncBuffer == 0 {
		c.BookingSyncBuffer = DefaultBookingSyncBuffer
	}
	if c.DecisionSyncBuffer == 0 {
		c.DecisionSyncBuffer = DefaultDecisionSyncBuffer
	}
	return nil
}

// normalize resolves the defaults for models models; memLimit reads the
// memory limit (0 = unknown). Afterwards MaxEntries and MaxEntriesPerWorker
// are the caps each model's index runs with, -1 meaning none.
func (l *IndexLimits) normalize(models int, memLimit func() int64) {
	if l.MaxEntries == 0 {
		if l.MaxBytes == 0 {
			l.MaxBytes = DefaultIndexMaxBytesFallback
			if m := memLimit(); m > 0 {
				l.MaxBytes = m / DefaultIndexMemoryFraction
			}
		}
		l.MaxEntries = -1
		if l.MaxBytes > 0 {
			l.MaxEntries = max(1, l.MaxBytes/int64(max(1, models))/IndexBytesPerEntry)
		}
	}
	if l.MaxEntries < 0 {
		l.MaxEntries = -1
	}
	if l.MaxEntriesPerWorker == 0 {
		l.MaxEntriesPerWorker = -1
		if l.MaxEntries > 0 {
			l.MaxEntriesPerWorker = max(1, l.MaxEntries/DefaultIndexWorkerShare)
		}
	}
	if l.MaxEntriesPerWorker < 0 {
		l.MaxEntriesPerWorker = -1
	}
	if l.EventHoldGrace == 0 {
		l.EventHoldGrace = DefaultEventHoldGrace
	}
	if l.EventHoldMax <= 0 {
		l.EventHoldMax = DefaultEventHoldMax
	}
}

// indexConfig is the configuration of model's event-fed index.
func (c *Config) indexConfig(model string) index.Config {
	return index.Config{Model: model, MaxEntries: max(0, c.IndexLimits.MaxEntries),
		MaxEntriesPerWorker: int(max(0, c.IndexLimits.MaxEntriesPerWorker))}
}

// normalizeHTTP fills the defaults of the HTTP bounds and the forwarding
// pool.
func (c *Config) normalizeHTTP() error {
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.HTTPReadHeaderTimeout, DefaultHTTPReadHeaderTimeout}, {&c.HTTPReadTimeout, DefaultHTTPReadTimeout},
		{&c.HTTPWriteTimeout, DefaultHTTPWriteTimeout}, {&c.HTTPIdleTimeout, DefaultHTTPIdleTimeout},
		{&c.ForwardTimeout, DefaultForwardTimeout},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
		if *d.v < 0 {
			return fmt.Errorf("%w: HTTP or forwarding timeout %v is negative", ErrConfig, *d.v)
		}
	}
	if c.HTTPMaxHeaderBytes == 0 {
		c.HTTPMaxHeaderBytes = DefaultHTTPMaxHeaderBytes
	}
	if c.ForwardConcurrency == 0 {
		c.ForwardConcurrency = DefaultForwardConcurrency
	}
	switch {
	case c.HTTPMaxHeaderBytes < 1:
		return fmt.Errorf("%w: HTTP max header bytes %d", ErrConfig, c.HTTPMaxHeaderBytes)
	case c.ForwardConcurrency < 1:
		return fmt.Errorf("%w: forward concurrency %d", ErrConfig, c.ForwardConcurrency)
	case c.MaxBodyBytes < 0 || c.MaxBodyBytes > api.MaxRouteBodySize:
		return fmt.Errorf("%w: max body bytes %d (want 0 for derived, or 1..%d)", ErrConfig, c.MaxBodyBytes, api.MaxRouteBodySize)
	}
	return nil
}
