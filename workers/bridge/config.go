package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/workers"
)

// Engine formats: which metric names the engine exports. Both publish the
// same KVEventBatch shapes, read by the same decoder.
const (
	FormatVLLM   = "vllm"
	FormatSGLang = "sglang"
)

// Defaults.
const (
	DefaultMetricsInterval = 250 * time.Millisecond
	DefaultStaleIntervals  = 3
	DefaultHealthInterval  = time.Second
	// DefaultHealthFailures: like Kubernetes' failureThreshold, one slow
	// or failed /health answer (a busy engine, a GC pause) does not take a
	// worker out of rotation; three in a row do.
	DefaultHealthFailures   = 3
	DefaultReplayTimeout    = 5 * time.Second
	DefaultMaxBatchedTokens = 8192
	DefaultMaxSeqs          = 256
)

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("bridge: invalid config")

// ErrBlockSize: the engine's block size differs from the router's, or from
// --block-size. Routers would ignore the worker, so the bridge refuses to
// start.
var ErrBlockSize = errors.New("bridge: block size mismatch")

// Config configures a Bridge for one engine.
type Config struct {
	// EngineURL is the engine's HTTP base URL (http://host:port): where the
	// bridge reaches it, registered as the worker's endpoint exactly as
	// given unless Advertise is set.
	EngineURL string
	// Advertise is the engine's address as gateways and proxies see it
	// (host:port, or a URL), when it differs from EngineURL (a sidecar
	// reaching its engine on 127.0.0.1): the worker registers
	// EngineURL's scheme and path on this host and port. The endpoint
	// picker (package epp) maps an InferencePool's pod ip:port to this
	// worker by it. "" = EngineURL.
	Advertise string
	// KVEvents is rank 0's PUB endpoint (tcp://host:5557); rank r uses its
	// port + r x DPPortOffset.
	KVEvents string
	// KVReplay is rank 0's replay endpoint, offset like KVEvents; "" = the
	// engine has no replay socket (every gap is a resync).
	KVReplay string
	Topic    string // ZMQ subscription prefix ("" = every topic)
	Model    string // required
	WorkerID string // required; the command derives a stable default
	// DataParallelSize is the number of ranks (default 1); DPPortOffset the
	// port step between them (default 1, as vLLM and SGLang).
	DataParallelSize int
	DPPortOffset     int
	EngineFormat     string // FormatVLLM (default) or FormatSGLang
	// Role is the engine's part in a prefill/decode-disaggregated fleet,
	// registered as is ("" = both; docs/pd.md); BootstrapPort an SGLang
	// prefill server's bootstrap port (0 = none).
	Role          workers.Role
	BootstrapPort int
	// BlockSize is the engine's block size; 0 = read it from the engine's
	// vllm:cache_config_info (SGLang exports none: give it).
	BlockSize int
	// RouterBlockSize is the block size the routers of Model hash at
	// (their --block-size); required.
	RouterBlockSize int
	// KVBlocks overrides the capacity in blocks per rank (0 = from
	// cache_config_info's num_gpu_blocks, or SGLang's
	// max_total_num_tokens / block size).
	KVBlocks int
	// MaxBatchedTokens and MaxSeqs are the engine's scheduler limits
	// (vLLM's --max-num-batched-tokens and --max-num-seqs), which no engine
	// exports; routers use them to predict load. Defaults 8192 and 256.
	MaxBatchedTokens int
	MaxSeqs          int

	MetricsInterval time.Duration // default 250ms
	StaleIntervals  int           // a scrape older than this many intervals is stale (default 3)
	HealthInterval  time.Duration // period of GET /health (default 1s)
	HealthFailures  int           // consecutive failed checks that make the worker unavailable (default 3); one success makes it healthy
	ReplayTimeout   time.Duration // bound on one replay request (default 5s)

	Prefix string // NATS subject prefix (default kvevents.DefaultPrefix)
	// Events are the publishers' batching knobs; Model, Worker, Rank,
	// Prefix, Epoch and SeqKeyed are set by the bridge.
	Events kvevents.PublisherConfig
	// EngineKeyed publishes engine-keyed batches (wire version 1), which
	// routers of a release before sequence-keyed batches need: they refuse
	// version 2. By default the bridge publishes sequence-keyed batches
	// (kvevents.Batch.SeqKeyed): it maps engine hashes to sequence hashes
	// itself, so routers apply plain set adds and removes.
	EngineKeyed bool
	Registry    workers.RegistryConfig
	DrainWait   time.Duration // longest flush of events at drain (default 10s)
	Logger      *slog.Logger  // nil = slog.Default()
}

func (c Config) withDefaults() (Config, error) {
	if c.DataParallelSize == 0 {
		c.DataParallelSize = 1
	}
	if c.DPPortOffset == 0 {
		c.DPPortOffset = 1
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if c.MaxSeqs == 0 {
		c.MaxSeqs = DefaultMaxSeqs
	}
	if c.EngineFormat == "" {
		c.EngineFormat = FormatVLLM
	}
	if c.MetricsInterval == 0 {
		c.MetricsInterval = DefaultMetricsInterval
	}
	if c.StaleIntervals == 0 {
		c.StaleIntervals = DefaultStaleIntervals
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.HealthFailures <= 0 {
		c.HealthFailures = DefaultHealthFailures
	}
	if c.ReplayTimeout == 0 {
		c.ReplayTimeout = DefaultReplayTimeout
	}
	if c.DrainWait == 0 {
		c.DrainWait = 10 * time.Second
	}
	if c.Prefix == "" {
		c.Prefix = kvevents.DefaultPrefix
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	bad := func(format string, a ...any) (Config, error) {
		return c, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	u, err := url.Parse(c.EngineURL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return bad("engine URL %q: want http://host:port", c.EngineURL)
	case c.Advertise != "" && c.endpoint() == "":
		return bad("advertise address %q: want host:port or http://host:port", c.Advertise)
	case c.Model == "":
		return bad("model is required")
	case c.WorkerID == "":
		return bad("worker id is required")
	case c.DataParallelSize < 1 || c.DataParallelSize > workers.MaxRanks:
		return bad("data-parallel size %d: want 1..%d", c.DataParallelSize, workers.MaxRanks)
	case c.DPPortOffset < 0:
		return bad("dp port offset %d: want >= 0", c.DPPortOffset)
	case c.EngineFormat != FormatVLLM && c.EngineFormat != FormatSGLang:
		return bad("engine format %q: want %q or %q", c.EngineFormat, FormatVLLM, FormatSGLang)
	case c.BlockSize < 0 || c.RouterBlockSize < 1:
		return bad("block size %d, router block size %d: want >= 0 and >= 1", c.BlockSize, c.RouterBlockSize)
	case c.EngineFormat == FormatSGLang && c.BlockSize == 0:
		return bad("SGLang exports no block size: give the engine's --page-size as block size")
	case c.MaxBatchedTokens < 1 || c.MaxSeqs < 1:
		return bad("max batched tokens %d, max seqs %d: want >= 1", c.MaxBatchedTokens, c.MaxSeqs)
	case c.MetricsInterval < 0 || c.StaleIntervals < 1 || c.HealthInterval < 0 || c.ReplayTimeout < 0:
		return bad("intervals must be positive (metrics %v, stale %d, health %v, replay %v)",
			c.MetricsInterval, c.StaleIntervals, c.HealthInterval, c.ReplayTimeout)
	}
	for r := range c.DataParallelSize {
		if _, _, err := c.endpoints(r); err != nil {
			return c, err
		}
	}
	return c, nil
}

// endpoints returns rank r's event and replay endpoints.
func (c Config) endpoints(r int) (events, replay string, err error) {
	if events, err = vllmzmq.OffsetEndpoint(c.KVEvents, r*c.DPPortOffset); err != nil {
		return "", "", fmt.Errorf("%w: kv events endpoint for rank %d: %w", ErrConfig, r, err)
	}
	if events == "" {
		return "", "", fmt.Errorf("%w: kv events endpoint is required", ErrConfig)
	}
	if replay, err = vllmzmq.OffsetEndpoint(c.KVReplay, r*c.DPPortOffset); err != nil {
		return "", "", fmt.Errorf("%w: kv replay endpoint for rank %d: %w", ErrConfig, r, err)
	}
	return events, replay, nil
}

// rankEvents returns rank's converter and publisher configs. Both take
// their keying from EngineKeyed: a publisher refuses every event of a
// converter keyed the other way.
func (c Config) rankEvents(blockSize int, rank uint32) (vllm.ConverterConfig, kvevents.PublisherConfig) {
	seqKeyed := !c.EngineKeyed
	pc := c.Events
	pc.Prefix, pc.Model, pc.Worker, pc.Rank, pc.Epoch, pc.SeqKeyed = c.Prefix, c.Model, c.WorkerID, rank, 0, seqKeyed
	if pc.Logger == nil {
		pc.Logger = c.Logger
	}
	return vllm.ConverterConfig{BlockSize: blockSize, SeqKeyed: seqKeyed}, pc
}

// endpoint is the worker's registered endpoint: EngineURL, or its scheme
// and path on Advertise's host and port ("" when Advertise is unusable).
func (c Config) endpoint() string {
	if c.Advertise == "" {
		return c.EngineURL
	}
	eu, err := url.Parse(c.EngineURL)
	if err != nil {
		return ""
	}
	hostport := c.Advertise
	if strings.Contains(c.Advertise, "://") {
		au, err := url.Parse(c.Advertise)
		if err != nil || au.Host == "" {
			return ""
		}
		eu.Scheme, hostport = au.Scheme, au.Host
	}
	if _, port, err := net.SplitHostPort(hostport); err != nil || port == "" {
		return ""
	}
	eu.Host = hostport
	return eu.String()
}

// engineURL joins path to the engine's base URL.
func (c Config) engineURL(path string) string { return strings.TrimRight(c.EngineURL, "/") + path }

// staleAfter is how old the last good scrape may be.
func (c Config) staleAfter() time.Duration {
	return time.Duration(c.StaleIntervals) * c.MetricsInterval
}
