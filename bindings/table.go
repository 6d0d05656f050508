package bindings

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/jskv"
)

// Defaults of Config.
const (
	DefaultBucket         = "kvr-bindings"
	DefaultIdleTTL        = 10 * time.Minute
	DefaultMarkerTTL      = time.Minute
	DefaultCacheEntries   = 65536
	DefaultMaxAttempts    = 4
	DefaultOpTimeout      = 2 * time.Second
	DefaultResolveTimeout = 5 * time.Second
	DefaultAPIPrefix      = jskv.DefaultAPIPrefix
	maxAttemptsLimit      = 16
)

// Config configures a Table. The zero value of every field means its
// default.
type Config struct {
	// Bucket is the KV bucket (default "kvr-bindings"), created if missing
	// with History 1 and per-key TTL (LimitMarkerTTL = MarkerTTL).
	Bucket string
	// Replicas of a bucket this Table creates (default 1; 3 in production).
	// An existing bucket is used as it is.
	Replicas int
	// Storage of a bucket this Table creates (default file).
	Storage jetstream.StorageType
	// DefaultMode is the mode of new bindings (default Hard).
	DefaultMode Mode
	// IdleTTL is how long an unused binding lives (default 10 min; whole
	// seconds, at least 2 s). The server removes a revision IdleTTL after
	// it stored it (never earlier; its expiry pass may run a few hundred
	// milliseconds late). A binding is renewed only once more than half of
	// that has passed since the revision was stored, so it stays stored for
	// at least IdleTTL/2 after the start of the last successful Route of
	// its session (less any clock skew between this process and the NATS
	// servers); once its session has been idle for IdleTTL it goes (as
	// soon as the server's expiry pass runs).
	IdleTTL time.Duration
	// MarkerTTL is how long delete and expiry markers stay in the bucket
	// (default 1 min, at least 1 s).
	MarkerTTL time.Duration
	// ReplicaID names this router replica in the values it writes (default:
	// "r-" and 8 random hex digits).
	ReplicaID string
	// StrictReads makes every read go to the stream leader
	// ($JS.API.STREAM.MSG.GET) instead of the local watch-fed cache: no
	// stale reads, one round trip more per request. No watch runs then.
	StrictReads bool
	// CacheEntries bounds the local cache (default 65536). Past it, entries
	// are evicted and a miss is confirmed on the stream leader.
	CacheEntries int
	// Liveness tells whether a bound worker is still in the fleet. Nil
	// means every worker is live (a Hard binding is then never moved).
	Liveness Liveness
	// MaxAttempts bounds the selector calls and the writes of one Route
	// (default 4, at most 16).
	MaxAttempts int
	// OpTimeout bounds one write (default 2 s). A write that gets no answer
	// in time has an unknown outcome and is resolved by a leader read.
	OpTimeout time.Duration
	// ResolveTimeout bounds the leader reads that resolve an unknown
	// outcome or a conflict (default 5 s; a leader election takes tens of
	// milliseconds).
	ResolveTimeout time.Duration
	// APIPrefix is the JetStream API prefix used for leader reads (default
	// "$JS.API"; set it when js uses a domain or a custom prefix).
	APIPrefix string
	// Logger gets rare events (watch lost, evictions). Default: discard.
	Logger *slog.Logger
}

func (c *Config) normalize() error {
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	switch c.DefaultMode {
	case ModeUnset:
		c.DefaultMode = Hard
	case Hard, Soft:
	default:
		return fmt.Errorf("%w: Config.DefaultMode %s", ErrUnknownMode, c.DefaultMode)
	}
	if c.IdleTTL == 0 {
		c.IdleTTL = DefaultIdleTTL
	}
	if c.IdleTTL < 2*time.Second {
		return fmt.Errorf("bindings: Config.IdleTTL %v below 2s (per-key TTLs have whole-second granularity)", c.IdleTTL)
	}
	c.IdleTTL = c.IdleTTL.Round(time.Second)
	if c.MarkerTTL == 0 {
		c.MarkerTTL = DefaultMarkerTTL
	}
	if c.MarkerTTL < time.Second {
		return fmt.Errorf("bindings: Config.MarkerTTL %v below 1s", c.MarkerTTL)
	}
	c.MarkerTTL = c.MarkerTTL.Round(time.Second)
	if c.ReplicaID == "" {
		c.ReplicaID = "r-" + strconv.FormatUint(rand.Uint64()>>32, 16)
	}
	if c.CacheEntries <= 0 {
		c.CacheEntries = DefaultCacheEntries
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxAttempts > maxAttemptsLimit {
		c.MaxAttempts = maxAttemptsLimit
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.ResolveTimeout <= 0 {
		c.ResolveTimeout = DefaultResolveTimeout
	}
	if c.APIPrefix == "" {
		c.APIPrefix = DefaultAPIPrefix
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Table is one router replica's handle on the bindings bucket. It is safe
// for concurrent use. Route is the commit protocol.
type Table struct {
	cfg         Config
	js          jetstream.JetStream
	nc          *nats.Conn
	kv          jetstream.KeyValue
	kvPre       string // "$KV.<bucket>."
	msgGetSubj  string // "$JS.API.STREAM.MSG.GET.KV_<bucket>"
	readTimeout time.Duration
	half        time.Duration
	publish     jskv.PublishFunc // js.PublishMsg; tests replace it to inject faults

	cache   *cache
	flights flights
	st      counters
	reqPool sync.Pool

	watcher    jetstream.KeyWatcher
	watchAlive atomic.Bool
	stop       chan struct{}
	wg         sync.WaitGroup
	closed     atomic.Bool
	closeOnce  sync.Once
}

// Open binds to (or creates) the bucket and, unless StrictReads is set,
// starts the watch that feeds the local cache and waits until it has
// delivered every existing binding. nc is the connection js runs on (nil:
// js.Conn()); leader reads are plain requests on it. Close the Table when
// done.
func Open(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, cfg Config) (*Table, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if nc == nil {
		nc = js.Conn()
	}
	kv, err := openBucket(ctx, js, &cfg)
	if err != nil {
		return nil, err
	}
	t := &Table{
		cfg:         cfg,
		js:          js,
		nc:          nc,
		kv:          kv,
		kvPre:       "$KV." + cfg.Bucket + ".",
		msgGetSubj:  jskv.MsgGetSubject(cfg.APIPrefix, cfg.Bucket),
		readTimeout: min(cfg.OpTimeout, 500*time.Millisecond),
		half:        cfg.IdleTTL / 2,
		publish:     js.PublishMsg,
		cache:       newCache(cfg.CacheEntries, cfg.MarkerTTL),
		flights:     flights{m: make(map[string]*flight)},
		stop:        make(chan struct{}),
	}
	t.reqPool.New = func() any { return new(Requirement) }
	if !cfg.StrictReads {
		if err := t.startWatch(ctx); err != nil {
			return nil, err
		}
	}
	t.wg.Add(1)
	go t.sweepLoop()
	return t, nil
}

func openBucket(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.KeyValue, error) {
	kv, err := jskv.EnsureBucket(ctx, js, jskv.BucketConfig{
		Bucket:       cfg.Bucket,
		Description:  "kvrouter session bindings (see docs/protocol.md)",
		Replicas:     cfg.Replicas,
		Storage:      cfg.Storage,
		MarkerTTL:    cfg.MarkerTTL,
		WaitForPeers: true, // a cluster that is still starting: wait while ctx allows
	})
	switch {
	case errors.Is(err, jskv.ErrBucketConfig):
		return nil, fmt.Errorf("%w: %w", ErrBucketConfig, err)
	case err != nil:
		return nil, fmt.Errorf("bindings: %w", err)
	}
	return kv, nil
}

func (t *Table) startWatch(ctx context.Context) error {
	w, err := t.kv.WatchAll(context.Background())
	if err != nil {
		return fmt.Errorf("bindings: watch bucket %q: %w", t.cfg.Bucket, err)
	}
	t.watcher = w
	ready := make(chan struct{})
	t.watchAlive.Store(true)
	t.wg.Add(1)
	go t.watchLoop(w, ready)
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		t.Close()
		return fmt.Errorf("bindings: initial watch of bucket %q: %w", t.cfg.Bucket, ctx.Err())
	}
}

// watchLoop applies watch entries to the cache until the table closes or the
// watch ends (then reads fall back to the leader).
func (t *Table) watchLoop(w jetstream.KeyWatcher, ready chan struct{}) {
	defer t.wg.Done()
	readyOnce := false
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				if !t.closed.Load() {
					t.cfg.Logger.Warn("bindings: watch ended; reading from the stream leader", "bucket", t.cfg.Bucket)
				}
				t.watchAlive.Store(false)
				return
			}
			if e == nil {
				if !readyOnce {
					readyOnce = true
					close(ready)
				}
				continue
			}
			t.cache.apply(e)
		case <-t.stop:
			t.watchAlive.Store(false)
			_ = w.Stop()
			// The subscription's callback blocks while the channel is
			// full: drain until it is closed so its goroutine can end.
			timeout := time.After(2 * time.Second)
			for {
				select {
				case _, ok := <-w.Updates():
					if !ok {
						return
					}
				case <-timeout:
					return
				}
			}
		}
	}
}

func (t *Table) sweepLoop() {
	defer t.wg.Done()
	every := min(max(t.cfg.IdleTTL/4, time.Second), 30*time.Second)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			t.cache.sweep(now)
		}
	}
}

// Close stops the watch and the sweeper. It does not close the connection.
func (t *Table) Close() error {
	t.closeOnce.Do(func() {
		t.closed.Store(true)
		close(t.stop)
		t.wg.Wait()
	})
	return nil
}

// Config returns the normalized configuration.
func (t *Table) Config() Config { return t.cfg }

// strict reports whether reads must go to the leader: configured, or the
// cache cannot be trusted to be complete.
func (t *Table) strict() bool {
	return t.cfg.StrictReads || !t.watchAlive.Load()
}

func (t *Table) live(worker string) bool {
	return t.cfg.Liveness == nil || t.cfg.Liveness.Live(worker)
}

// Get returns the session's binding: from the cache, or from the stream
// leader under StrictReads or when the cache cannot prove absence.
func (t *Table) Get(ctx context.Context, model, session string) (Binding, error) {
	if err := validate(model, session); err != nil {
		t.st.badInput.Add(1)
		return Binding{}, err
	}
	var kbuf [maxKeyLen]byte
	kb := appendKey(kbuf[:0], model, session)
	st, err := t.firstRead(ctx, kb)
	if err != nil {
		return Binding{}, err
	}
	if st.bad != nil {
		t.st.malformed.Add(1)
		return Binding{}, st.bad
	}
	if !st.present {
		return Binding{}, fmt.Errorf("%w: session %q (model %q)", ErrNotFound, session, model)
	}
	return st.rec.binding(st.rev), nil
}

// firstRead is step 1 of the protocol: the cache when it can answer, else
// the stream leader.
func (t *Table) firstRead(ctx context.Context, kb []byte) (readState, error) {
	if !t.strict() {
		st, ok := t.cache.get(kb)
		now := time.Now()
		switch {
		case ok && !st.present && t.cache.dead(&st, now):
			// The server has dropped the marker too: nothing is stored.
			return readState{}, nil
		case ok && (!st.present || st.live(now)):
			return st, nil
		case !ok && !t.cache.incomplete.Load():
			return readState{}, nil
		}
	}
	return t.leaderRead(ctx, string(kb), t.cfg.ResolveTimeout)
}

// End removes the session's binding (a conditional purge on the revision
// read from the leader; retried if another write intervenes). It also
// removes a malformed value. ErrNotFound if there was no binding.
func (t *Table) End(ctx context.Context, model, session string) error {
	if err := validate(model, session); err != nil {
		t.st.badInput.Add(1)
		return err
	}
	key, _ := Key(model, session)
	for i := 0; i < t.cfg.MaxAttempts; i++ {
		st, err := t.leaderRead(ctx, key, t.cfg.ResolveTimeout)
		if err != nil {
			return err
		}
		if !st.present {
			if i == 0 {
				return fmt.Errorf("%w: session %q (model %q)", ErrNotFound, session, model)
			}
			return nil // our earlier, unanswered purge landed, or someone else's
		}
		rev, err := t.casPurge(ctx, key, st.rev)
		switch {
		case err == nil:
			t.cache.put(key, &readState{rev: rev, storedAt: time.Now()})
			t.st.ended.Add(1)
			return nil
		case errors.Is(err, ErrConflict):
			t.st.conflicts.Add(1)
		case isAmbiguous(err):
			t.st.ambiguous.Add(1) // the next leader read tells
		default:
			return fmt.Errorf("bindings: end session %q (model %q): %w", session, model, err)
		}
	}
	t.st.exhausted.Add(1)
	return fmt.Errorf("%w: end session %q (model %q) after %d attempts: %w", ErrTooManyConflicts, session, model, t.cfg.MaxAttempts, ErrConflict)
}

// flights single-flights the creation of a binding within one replica:
// concurrent first requests of a session wait for the one creating it.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct{ done chan struct{} }

// join returns the flight in progress for key (leader false), or a new one
// that the caller leads and must finish.
func (f *flights) join(key string) (*flight, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl, ok := f.m[key]; ok {
		return fl, false
	}
	fl := &flight{done: make(chan struct{})}
	f.m[key] = fl
	return fl, true
}

func (f *flights) finish(key string, fl *flight) {
	f.mu.Lock()
	if f.m[key] == fl {
		delete(f.m, key)
	}
	f.mu.Unlock()
	close(fl.done)
}
