package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/internal/escape"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/nats-io/nats.go"
)

// Load report defaults.
const (
	DefaultPrefix       = kvevents.DefaultPrefix
	DefaultLoadInterval = time.Second
	MaxLoadReportBytes  = 4 << 10
)

// LoadReport is one (worker, rank)'s load as the engine sees it. Routers
// use it to correct their own predicted load and to detect overload.
type LoadReport struct {
	Model           string    `json:"model"`
	Worker          string    `json:"worker"`
	Rank            uint32    `json:"rank"`
	ActiveRequests  int       `json:"active_requests"`  // running (in the batch)
	WaitingRequests int       `json:"waiting_requests"` // queued in the engine
	KVUsedBlocks    int       `json:"kv_used_blocks"`   // blocks referenced by running requests or cached
	KVTotalBlocks   int       `json:"kv_total_blocks"`
	PrefillTokens   int       `json:"prefill_tokens"` // prompt tokens still to prefill
	At              time.Time `json:"at"`             // when the engine measured it
}

// ErrInvalidLoad is wrapped by every LoadReport validation or decoding
// error.
var ErrInvalidLoad = errors.New("workers: invalid load report")

func badLoad(r *LoadReport, format string, args ...any) error {
	return fmt.Errorf("%w (worker %q rank %d): %s", ErrInvalidLoad, r.Worker, r.Rank, fmt.Sprintf(format, args...))
}

// Validate checks a report's fields.
func (r LoadReport) Validate() error {
	if msg := checkName(r.Model, MaxIDLen); msg != "" {
		return badLoad(&r, "model %q: %s", r.Model, msg)
	}
	if msg := checkName(r.Worker, MaxIDLen); msg != "" {
		return badLoad(&r, "worker: %s", msg)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"active_requests", r.ActiveRequests}, {"waiting_requests", r.WaitingRequests},
		{"kv_used_blocks", r.KVUsedBlocks}, {"kv_total_blocks", r.KVTotalBlocks}, {"prefill_tokens", r.PrefillTokens}} {
		if f.v < 0 {
			return badLoad(&r, "%s %d is negative", f.name, f.v)
		}
	}
	if r.KVTotalBlocks > 0 && r.KVUsedBlocks > r.KVTotalBlocks {
		return badLoad(&r, "kv_used_blocks %d exceeds kv_total_blocks %d", r.KVUsedBlocks, r.KVTotalBlocks)
	}
	if r.At.IsZero() {
		return badLoad(&r, "at is missing")
	}
	return nil
}

// LoadSubject returns <prefix>.load.<model>.<worker>, model and worker
// escaped by escape.SubjectToken (the same tokens as the worker's event
// subject). An empty prefix means DefaultPrefix.
func LoadSubject(prefix, model, worker string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + ".load." + escape.SubjectToken.Escape(model) + "." + escape.SubjectToken.Escape(worker)
}

// LoadFilter returns the subscription subject for one model's reports, or
// for every model when model is "".
func LoadFilter(prefix, model string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if model == "" {
		return prefix + ".load.*.*"
	}
	return prefix + ".load." + escape.SubjectToken.Escape(model) + ".*"
}

// EncodeLoad validates r and returns its JSON message.
func EncodeLoad(r LoadReport) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// DecodeLoad parses and validates a load message.
func DecodeLoad(data []byte) (LoadReport, error) {
	var r LoadReport
	if len(data) > MaxLoadReportBytes {
		return r, fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidLoad, len(data), MaxLoadReportBytes)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return LoadReport{}, fmt.Errorf("%w: %w", ErrInvalidLoad, err)
	}
	if err := r.Validate(); err != nil {
		return LoadReport{}, err
	}
	return r, nil
}

// PublishLoad publishes one report on LoadSubject (core NATS: a report is
// only useful fresh, so nothing is stored). A zero At is set to now.
func PublishLoad(nc *nats.Conn, prefix string, r LoadReport) error {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if r.At.IsZero() {
		r.At = time.Now()
	}
	data, err := EncodeLoad(r)
	if err != nil {
		return err
	}
	if err := nc.Publish(LoadSubject(prefix, r.Model, r.Worker), data); err != nil {
		return fmt.Errorf("workers: publish load of %q rank %d: %w", r.Worker, r.Rank, err)
	}
	return nil
}

// LoadReporterConfig configures a LoadReporter.
type LoadReporterConfig struct {
	Prefix   string              // subject prefix; DefaultPrefix
	Interval time.Duration       // DefaultLoadInterval
	Source   func() []LoadReport // called every Interval; one report per rank
	Logger   *slog.Logger        // default slog.Default()
}

// LoadReporter publishes what Source returns every Interval.
type LoadReporter struct {
	nc        *nats.Conn
	cfg       LoadReporterConfig
	log       *slog.Logger
	cancel    context.CancelFunc
	done      chan struct{}
	stopOnce  sync.Once
	published atomic.Uint64
	failed    atomic.Uint64
}

// StartLoadReporter publishes a first round at once and then one every
// Interval until Stop.
func StartLoadReporter(nc *nats.Conn, cfg LoadReporterConfig) (*LoadReporter, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: load reporter needs a NATS connection", ErrConfig)
	}
	if cfg.Source == nil {
		return nil, fmt.Errorf("%w: load reporter needs a Source", ErrConfig)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultLoadInterval
	}
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("%w: load Interval %v is negative", ErrConfig, cfg.Interval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	lr := &LoadReporter{nc: nc, cfg: cfg, log: cfg.Logger.With("component", "workers.load"), cancel: cancel, done: make(chan struct{})}
	go lr.run(ctx)
	return lr, nil
}

func (lr *LoadReporter) run(ctx context.Context) {
	defer close(lr.done)
	t := time.NewTicker(lr.cfg.Interval)
	defer t.Stop()
	for {
		lr.publishRound()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (lr *LoadReporter) publishRound() {
	now := time.Now()
	for _, r := range lr.cfg.Source() {
		if r.At.IsZero() {
			r.At = now
		}
		if err := PublishLoad(lr.nc, lr.cfg.Prefix, r); err != nil {
			if lr.failed.Add(1) == 1 || errors.Is(err, ErrInvalidLoad) {
				lr.log.Warn("load report not published", "err", err)
			}
			continue
		}
		lr.published.Add(1)
	}
}

// Published returns the number of reports sent and not sent.
func (lr *LoadReporter) Published() (sent, failed uint64) {
	return lr.published.Load(), lr.failed.Load()
}

// Stop ends the reporter and waits for its goroutine. Idempotent.
func (lr *LoadReporter) Stop() {
	lr.stopOnce.Do(lr.cancel)
	<-lr.done
}

// LoadSubscription delivers decoded load reports to a handler.
type LoadSubscription struct {
	sub     *nats.Subscription
	prefix  string
	log     *slog.Logger
	handler func(LoadReport)

	received, invalid, mismatched atomic.Uint64
	// lastMismatch (unix nanoseconds) is when the last report whose
	// subject names another worker than its payload arrived: one log line
	// per episode, an episode ending after mismatchEpisode without one.
	lastMismatch atomic.Int64
}

// mismatchEpisode: mismatched load reports further apart than this are
// logged again.
const mismatchEpisode = time.Minute

// SubscribeOption adjusts SubscribeLoad.
type SubscribeOption func(*LoadSubscription)

// WithLoadLogger sets the subscription's logger (default slog.Default()).
func WithLoadLogger(l *slog.Logger) SubscribeOption {
	return func(ls *LoadSubscription) {
		if l != nil {
			ls.log = l
		}
	}
}

// SubscribeLoad subscribes to one model's load reports (every model when
// model is ""). Each message is decoded and validated (bad ones are
// counted as invalid, logged once per subscription, and skipped), and its
// subject must name the report's model and worker: NATS permissions can
// limit a worker to its own subject but not what it writes inside, so a
// report about another worker is rejected and counted as mismatched, with
// one log line per episode. handler runs on the subscription's goroutine,
// one report at a time.
func SubscribeLoad(nc *nats.Conn, prefix, model string, handler func(LoadReport), opts ...SubscribeOption) (*LoadSubscription, error) {
	if nc == nil || handler == nil {
		return nil, fmt.Errorf("%w: SubscribeLoad needs a connection and a handler", ErrConfig)
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	ls := &LoadSubscription{prefix: prefix, log: slog.Default(), handler: handler}
	for _, o := range opts {
		o(ls)
	}
	ls.log = ls.log.With("component", "workers.load")
	sub, err := nc.Subscribe(LoadFilter(prefix, model), ls.onMsg)
	if err != nil {
		return nil, fmt.Errorf("workers: subscribe load %q: %w", LoadFilter(prefix, model), err)
	}
	ls.sub = sub
	return ls, nil
}

func (ls *LoadSubscription) onMsg(m *nats.Msg) {
	r, err := DecodeLoad(m.Data)
	if err == nil {
		if want := LoadSubject(ls.prefix, r.Model, r.Worker); m.Subject != want {
			ls.mismatched.Add(1)
			now := time.Now().UnixNano()
			if last := ls.lastMismatch.Swap(now); now-last > int64(mismatchEpisode) {
				ls.log.Warn("rejecting load reports whose subject names another worker than the report (further ones within a minute are only counted)",
					"subject", m.Subject, "worker", r.Worker, "model", r.Model, "want_subject", want)
			}
			return
		}
	}
	if err != nil {
		if ls.invalid.Add(1) == 1 {
			ls.log.Warn("skipping bad load report (further ones are only counted)", "subject", m.Subject, "err", err)
		}
		return
	}
	ls.received.Add(1)
	ls.handler(r)
}

// Stats returns how many reports were delivered and how many skipped as
// invalid (see Mismatched for the other rejections).
func (ls *LoadSubscription) Stats() (received, invalid uint64) {
	return ls.received.Load(), ls.invalid.Load()
}

// Mismatched returns how many valid reports were rejected because their
// subject names another model or worker than the report itself.
func (ls *LoadSubscription) Mismatched() uint64 { return ls.mismatched.Load() }

// Stop unsubscribes. Reports already being delivered may still reach the
// handler.
func (ls *LoadSubscription) Stop() error {
	if err := ls.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		return fmt.Errorf("workers: unsubscribe load: %w", err)
	}
	return nil
}
