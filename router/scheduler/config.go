package scheduler

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/workerref"
)

// Thresholds decide when a worker is overloaded (not a candidate at all) and
// when it is busy (a request waits in the router only when every eligible
// worker is busy). Each is a fraction of the worker's capacity; 0 disables
// that check, and so does an unknown capacity (0 in WorkerInfo). A worker is
// over a threshold when its booked load reaches (>=) fraction × capacity.
// They can be changed at run time with SetThresholds.
type Thresholds struct {
	// Overload: booked active prefill tokens vs MaxBatchedTokens.
	OverloadPrefillFrac float64 `yaml:"overload_prefill_frac" json:"overload_prefill_frac"`
	// Overload: booked decode blocks vs KVBlocks.
	OverloadDecodeFrac float64 `yaml:"overload_decode_frac" json:"overload_decode_frac"`
	// Queue: booked active prefill tokens vs MaxBatchedTokens.
	QueuePrefillFrac float64 `yaml:"queue_prefill_frac" json:"queue_prefill_frac"`
	// Queue: booked decode blocks vs KVBlocks.
	QueueDecodeFrac float64 `yaml:"queue_decode_frac" json:"queue_decode_frac"`
}

// DefaultThresholds: no overload shedding; a request waits in the router
// once every eligible worker has eight full batches of prefill booked or
// its KV cache fully booked. Why eight: at two (the earlier default) a
// worker with one long prompt in prefill and one queued counted as busy, so
// under saturation every request waited in the router and the engines ran
// on at most two steps of queued prefill, each refill a round trip of
// first token, prefill_done and dispatch: on the Mooncake synthetic trace at
// 10x load the default policy's TTFT p50 was 3.1 s with the queue at two
// batches, 2.1 s at eight and without a router queue; on the conversation
// trace at 6.5x the threshold made no difference (docs/benchmarks.md,
// "Router queue threshold"). Eight still queues in the router, and so keeps
// late binding, priorities and deadlines, once the fleet is deeply
// overloaded. Dynamo's router queues only when its threshold is set.
func DefaultThresholds() Thresholds {
	return Thresholds{QueuePrefillFrac: 8.0, QueueDecodeFrac: 1.0}
}

func (t Thresholds) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"overload_prefill_frac", t.OverloadPrefillFrac},
		{"overload_decode_frac", t.OverloadDecodeFrac},
		{"queue_prefill_frac", t.QueuePrefillFrac},
		{"queue_decode_frac", t.QueueDecodeFrac},
	} {
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%w: threshold %s = %v (want a finite value >= 0)", ErrInvalidConfig, f.name, f.v)
		}
	}
	return nil
}

// Order is the order of waiting requests inside one priority tier.
type Order uint8

const (
	FCFS Order = iota // first come, first served
	WSPT              // shortest uncached work first (ties: first come)
)

// String returns fcfs or wspt.
func (o Order) String() string {
	if o == WSPT {
		return "wspt"
	}
	return "fcfs"
}

// MarshalText makes Order readable in YAML and JSON.
func (o Order) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText parses fcfs or wspt (empty = fcfs).
func (o *Order) UnmarshalText(b []byte) error {
	switch string(b) {
	case "", "fcfs":
		*o = FCFS
	case "wspt":
		*o = WSPT
	default:
		return fmt.Errorf("%w: queue order %q (want fcfs or wspt)", ErrInvalidConfig, b)
	}
	return nil
}

// QueueLimit bounds one class's waiting requests. 0 = unlimited. With
// PerWorker the limits are multiplied by the number of known workers (at
// least 1), so they scale with the fleet.
type QueueLimit struct {
	Requests  int  `yaml:"requests" json:"requests"`
	Tokens    int  `yaml:"tokens" json:"tokens"` // sum of waiting requests' uncached prompt tokens
	PerWorker bool `yaml:"per_worker" json:"per_worker"`
}

// QueueConfig shapes the router-side queue.
type QueueConfig struct {
	Order Order `yaml:"order" json:"order"`
	// Limits per request class; classes not listed use Default.
	Limits  map[string]QueueLimit `yaml:"limits" json:"limits"`
	Default QueueLimit            `yaml:"default" json:"default"`
	// RefreshAfter: a waiter older than this gets its overlaps refreshed
	// through Config.Refresh before selection. Default 10 s; negative = never.
	RefreshAfter time.Duration `yaml:"refresh_after" json:"refresh_after"`
}

// Classifier is a plugin that may suggest a target for a request. Its target
// is always Soft: it can neither replace nor clear a Hard requirement. It is
// called under the scheduler's lock and must be fast and side-effect free.
type Classifier interface {
	Classify(r *Request) (workerref.Target, bool)
}

// ClassifierFunc adapts a function to Classifier.
type ClassifierFunc func(r *Request) (workerref.Target, bool)

// Classify calls f.
func (f ClassifierFunc) Classify(r *Request) (workerref.Target, bool) { return f(r) }

// RefreshFunc returns fresh overlaps for a request that waited long; it
// appends to dst and returns it. Called under the scheduler's lock: no
// I/O, be quick, do not call the scheduler.
type RefreshFunc func(r *Request, dst []Overlap) []Overlap

// Config configures a Scheduler. The zero value is usable (after defaults).
type Config struct {
	// Replica names this router replica in booking events; own echoes are
	// ignored by it. Default: random hex.
	Replica string `yaml:"replica"`
	// Model, when set, is the only model this scheduler serves.
	Model string `yaml:"model"`
	// BlockSize is the KV block size in tokens of the seq hashes (default 16).
	BlockSize  int        `yaml:"block_size"`
	Thresholds Thresholds `yaml:"thresholds"`
	// ThresholdsSet says Thresholds was given (so all-zero means "off"
	// rather than "use the defaults"). LoadConfigYAML sets it.
	ThresholdsSet bool        `yaml:"-"`
	Queue         QueueConfig `yaml:"queue"`

	// BookingTTL: a local booking untouched (no PrefillDone) for this long
	// is taken as vanished and freed. Default 300 s.
	BookingTTL time.Duration `yaml:"booking_ttl"`
	// RemoteTTL: the same for bookings learned from other replicas; it bounds
	// how stale the shared load view can get if a free is lost. Default 300 s.
	RemoteTTL time.Duration `yaml:"remote_ttl"`
	// MaxRemoteBookings bounds the remote bookings held; further adds are
	// dropped and counted. Default 65,536.
	MaxRemoteBookings int `yaml:"max_remote_bookings"`
	// LoadReportTTL: a load report's correction is dropped when no newer
	// report arrives for this long. Default 10 s.
	LoadReportTTL time.Duration `yaml:"load_report_ttl"`
	// GuardInterval: how often the guard expires bookings. Default 30 s.
	GuardInterval time.Duration `yaml:"guard_interval"`
	// CommandBuffer is accepted and checked (not negative) but no longer
	// used: calls run under the scheduler's lock, with no inbox (kept so
	// that existing configurations still load).
	CommandBuffer int `yaml:"command_buffer"`
	// Seed makes random choices reproducible (with HasSeed). A policy that
	// implements Seeded can supply it too; Config wins.
	Seed    uint64 `yaml:"seed"`
	HasSeed bool   `yaml:"-"`

	Refresh         RefreshFunc        `yaml:"-"`
	Classifier      Classifier         `yaml:"-"`
	OnBookingChange func(BookingEvent) `yaml:"-"`
	// Now is the clock (default time.Now); tests inject a fake one.
	Now    func() time.Time `yaml:"-"`
	Logger *slog.Logger     `yaml:"-"`
}

// LoadConfigYAML parses a Config from YAML (durations as "10s"). Fields that
// are not set keep their defaults; a `seed:` key sets HasSeed and a
// `thresholds:` key sets ThresholdsSet.
func LoadConfigYAML(data []byte) (Config, error) {
	var cfg Config
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	var keys map[string]yaml.Node
	if err := yaml.Unmarshal(data, &keys); err == nil {
		_, cfg.HasSeed = keys["seed"]
		_, cfg.ThresholdsSet = keys["thresholds"]
	}
	return cfg, nil
}

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.Replica == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		out.Replica = hex.EncodeToString(b[:])
	}
	if out.BlockSize == 0 {
		out.BlockSize = 16
	}
	if out.BlockSize < 0 {
		return out, fmt.Errorf("%w: block_size %d", ErrInvalidConfig, out.BlockSize)
	}
	if !out.ThresholdsSet && out.Thresholds == (Thresholds{}) {
		out.Thresholds = DefaultThresholds()
	}
	if err := out.Thresholds.validate(); err != nil {
		return out, err
	}
	if out.Queue.RefreshAfter == 0 {
		out.Queue.RefreshAfter = 10 * time.Second
	}
	if out.BookingTTL == 0 {
		out.BookingTTL = 300 * time.Second
	}
	if out.RemoteTTL == 0 {
		out.RemoteTTL = 300 * time.Second
	}
	if out.MaxRemoteBookings == 0 {
		out.MaxRemoteBookings = 65536
	}
	if out.LoadReportTTL == 0 {
		out.LoadReportTTL = 10 * time.Second
	}
	if out.GuardInterval == 0 {
		out.GuardInterval = 30 * time.Second
	}
	for name, d := range map[string]time.Duration{
		"booking_ttl": out.BookingTTL, "remote_ttl": out.RemoteTTL,
		"load_report_ttl": out.LoadReportTTL, "guard_interval": out.GuardInterval,
	} {
		if d < 0 {
			return out, fmt.Errorf("%w: %s %v", ErrInvalidConfig, name, d)
		}
	}
	if out.MaxRemoteBookings < 0 || out.CommandBuffer < 0 {
		return out, fmt.Errorf("%w: max_remote_bookings %d, command_buffer %d", ErrInvalidConfig,
			out.MaxRemoteBookings, out.CommandBuffer)
	}
	check := func(name string, l QueueLimit) error {
		if l.Requests < 0 || l.Tokens < 0 {
			return fmt.Errorf("%w: queue limit %q: requests %d, tokens %d", ErrInvalidConfig, name, l.Requests, l.Tokens)
		}
		return nil
	}
	if err := check("default", out.Queue.Default); err != nil {
		return out, err
	}
	for k, l := range out.Queue.Limits {
		if err := check(k, l); err != nil {
			return out, err
		}
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out, nil
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}
