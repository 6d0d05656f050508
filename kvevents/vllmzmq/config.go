package vllmzmq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Defaults of vLLM's KVEventsConfig (vllm/config/kv_events.py).
const (
	DefaultEndpoint     = "tcp://*:5557"
	DefaultBufferSteps  = 10_000
	DefaultHWM          = 100_000
	DefaultMaxQueueSize = 100_000
)

// Publisher names vLLM accepts.
const (
	PublisherZMQ  = "zmq"
	PublisherNull = "null"
)

// ErrBadConfig wraps every configuration error.
var ErrBadConfig = errors.New("vllmzmq: bad kv-events config")

// Config mirrors vLLM's --kv-events-config JSON field for field, with
// vLLM's defaults (DefaultConfig). The zero value is "events disabled".
type Config struct {
	// EnableKVCacheEvents turns events on; false means the null publisher
	// whatever Publisher says (as vLLM's EventPublisherFactory decides).
	EnableKVCacheEvents bool `json:"enable_kv_cache_events"`
	// Publisher is "zmq" or "null"; empty means "zmq" when events are
	// enabled, else "null" (vLLM's __post_init__).
	Publisher string `json:"publisher"`
	// Endpoint is the PUB socket's address (default tcp://*:5557). It is
	// bound or connected by vLLM's rule (Binds).
	Endpoint string `json:"endpoint"`
	// ReplayEndpoint is the ROUTER replay socket's address; empty means no
	// replay socket. It is always bound, as in vLLM.
	ReplayEndpoint string `json:"replay_endpoint"`
	// BufferSteps is how many batches (engine steps) the replay ring keeps.
	BufferSteps int `json:"buffer_steps"`
	// HWM is the PUB socket's high-water mark: batches queued beyond it are
	// dropped (0 = no limit, as in ZeroMQ).
	HWM int `json:"hwm"`
	// MaxQueueSize bounds vLLM's queue between the scheduler and its
	// publisher thread. The simulator has no such queue (a batch is encoded
	// at the end of its step and handed to the PUB socket, whose queue HWM
	// bounds), so it is validated and otherwise unused.
	MaxQueueSize int `json:"max_queue_size"`
	// Topic is the first frame of every message (default "").
	Topic string `json:"topic"`
}

// DefaultConfig returns vLLM's defaults with events disabled.
func DefaultConfig() Config {
	return Config{
		Endpoint:     DefaultEndpoint,
		BufferSteps:  DefaultBufferSteps,
		HWM:          DefaultHWM,
		MaxQueueSize: DefaultMaxQueueSize,
	}
}

// ParseKVEventsConfig parses the JSON of vLLM's --kv-events-config flag.
// Fields left out take vLLM's defaults; unknown fields are ignored (later
// vLLM releases add some); a publisher other than "zmq" or "null", a null
// JSON value, or an out-of-range number is an error wrapping ErrBadConfig.
func ParseKVEventsConfig(data []byte) (Config, error) {
	cfg := DefaultConfig()
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) || trimmed[0] != '{' {
		return Config{}, fmt.Errorf("%w: want a JSON object, got %q", ErrBadConfig, abbrev(trimmed))
	}
	// A JSON null for replay_endpoint means None in vLLM; the others have
	// no None form. Decode through pointers so null is told apart.
	var raw struct {
		Enable         *bool   `json:"enable_kv_cache_events"`
		Publisher      *string `json:"publisher"`
		Endpoint       *string `json:"endpoint"`
		ReplayEndpoint *string `json:"replay_endpoint"`
		BufferSteps    *int    `json:"buffer_steps"`
		HWM            *int    `json:"hwm"`
		MaxQueueSize   *int    `json:"max_queue_size"`
		Topic          *string `json:"topic"`
	}
	if err := json.Unmarshal(trimmed, &raw); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	set := func(dst *string, src *string) {
		if src != nil {
			*dst = *src
		}
	}
	if raw.Enable != nil {
		cfg.EnableKVCacheEvents = *raw.Enable
	}
	set(&cfg.Publisher, raw.Publisher)
	set(&cfg.Endpoint, raw.Endpoint)
	set(&cfg.ReplayEndpoint, raw.ReplayEndpoint)
	set(&cfg.Topic, raw.Topic)
	for _, f := range []struct {
		dst *int
		src *int
	}{{&cfg.BufferSteps, raw.BufferSteps}, {&cfg.HWM, raw.HWM}, {&cfg.MaxQueueSize, raw.MaxQueueSize}} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

func abbrev(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

// PublisherName returns the publisher that runs: "zmq" or "null".
func (c Config) PublisherName() string {
	if !c.EnableKVCacheEvents {
		return PublisherNull
	}
	if c.Publisher == "" {
		return PublisherZMQ
	}
	return c.Publisher
}

// Enabled reports whether events are published over ZMQ.
func (c Config) Enabled() bool { return c.PublisherName() == PublisherZMQ }

// Validate checks the publisher name and, when events are enabled, the
// endpoints and sizes. Errors wrap ErrBadConfig and name the bad value.
func (c Config) Validate() error {
	switch c.Publisher {
	case "", PublisherZMQ, PublisherNull:
	default:
		return fmt.Errorf("%w: publisher %q (want %q or %q)", ErrBadConfig, c.Publisher, PublisherZMQ, PublisherNull)
	}
	if !c.Enabled() {
		return nil
	}
	if _, _, err := splitEndpoint(c.Endpoint); err != nil {
		return fmt.Errorf("%w: endpoint: %v", ErrBadConfig, err)
	}
	if !Binds(c.Endpoint) && strings.HasSuffix(c.Endpoint, ":0") {
		// Port 0 means "any free port" only to a bind; by vLLM's rule a
		// non-wildcard host connects, and nothing listens on port 0.
		return fmt.Errorf("%w: endpoint %q connects (only a wildcard host such as tcp://*:0 binds) to port 0, where no subscriber can listen", ErrBadConfig, c.Endpoint)
	}
	if c.ReplayEndpoint != "" {
		if _, _, err := splitEndpoint(c.ReplayEndpoint); err != nil {
			return fmt.Errorf("%w: replay_endpoint: %v", ErrBadConfig, err)
		}
	}
	switch {
	case c.BufferSteps < 1:
		return fmt.Errorf("%w: buffer_steps %d (want >= 1)", ErrBadConfig, c.BufferSteps)
	case c.HWM < 0:
		return fmt.Errorf("%w: hwm %d (want >= 0)", ErrBadConfig, c.HWM)
	case c.MaxQueueSize < 1:
		return fmt.Errorf("%w: max_queue_size %d (want >= 1)", ErrBadConfig, c.MaxQueueSize)
	}
	return nil
}

// ForRank returns the configuration data-parallel rank r publishes with:
// both endpoints moved by OffsetEndpoint. Use it also to give the n-th of
// several engines in one process its own ports.
func (c Config) ForRank(r int) (Config, error) {
	ep, err := OffsetEndpoint(c.Endpoint, r)
	if err != nil {
		return Config{}, err
	}
	rep, err := OffsetEndpoint(c.ReplayEndpoint, r)
	if err != nil {
		return Config{}, err
	}
	c.Endpoint, c.ReplayEndpoint = ep, rep
	return c, nil
}

// OffsetEndpoint moves endpoint to data-parallel rank r as vLLM's
// ZmqEventPublisher.offset_endpoint_port does: unchanged for rank 0 or an
// empty endpoint; inproc:// and ipc:// get the suffix "_dp<r>"; tcp:// gets
// its port plus r, except port 0 (an ephemeral port, which every rank binds
// on its own, as current vLLM leaves it). Errors wrap ErrBadConfig.
func OffsetEndpoint(endpoint string, r int) (string, error) {
	if endpoint == "" || r == 0 {
		return endpoint, nil
	}
	if r < 0 {
		return "", fmt.Errorf("%w: negative rank %d", ErrBadConfig, r)
	}
	scheme, addr, err := splitEndpoint(endpoint)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	if scheme != "tcp" {
		return endpoint + "_dp" + strconv.Itoa(r), nil
	}
	i := strings.LastIndexByte(addr, ':')
	port, _ := strconv.Atoi(addr[i+1:]) // checked by splitEndpoint
	if port == 0 {
		return endpoint, nil
	}
	if port+r > 65535 {
		return "", fmt.Errorf("%w: port %d + rank %d is above 65535 in %q", ErrBadConfig, port, r, endpoint)
	}
	return "tcp://" + addr[:i+1] + strconv.Itoa(port+r), nil
}

// Binds reports whether vLLM binds endpoint (rather than connecting to it):
// when it contains "*", "::" or "0.0.0.0" (a wildcard host), or uses the
// ipc:// or inproc:// transport. Every other endpoint is connected to: the
// engine dials a SUB that someone else bound (llm-d's centralized mode).
// The replay endpoint is always bound, whatever its form.
func Binds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.Contains(endpoint, "0.0.0.0") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// splitEndpoint checks endpoint's form: tcp://host:port (host may be "*"
// or a bracketed IPv6 address; port 0-65535), ipc://path or inproc://name.
func splitEndpoint(endpoint string) (scheme, addr string, err error) {
	scheme, addr, ok := strings.Cut(endpoint, "://")
	if !ok || addr == "" {
		return "", "", fmt.Errorf("endpoint %q is not transport://address", endpoint)
	}
	switch scheme {
	case "ipc", "inproc":
		return scheme, addr, nil
	case "tcp":
	default:
		return "", "", fmt.Errorf("endpoint %q: transport %q (want tcp, ipc or inproc)", endpoint, scheme)
	}
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", "", fmt.Errorf("endpoint %q has no port", endpoint)
	}
	port, err := strconv.Atoi(addr[i+1:])
	if err != nil || port < 0 || port > 65535 {
		return "", "", fmt.Errorf("endpoint %q: port %q is not 0-65535", endpoint, addr[i+1:])
	}
	return scheme, addr, nil
}
