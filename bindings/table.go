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
	"github.com/kvrouter/kvrouter/session"
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
	DefaultMaxStaleness   = time.Second
	MinMaxStaleness       = 40 * time.Millisecond
	DefaultMaxSessions    = 1_000_000
	DefaultMaxBytes       = 1 << 30
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
	DefaultMode session.Mode
	// IdleTTL is how long a binding lives at least after the last request
	// of its session (default 10 min; whole seconds, at least 2 s). Each
	// revision is stored with the message TTL StoredTTL(IdleTTL) (1.5 x
	// IdleTTL, rounded up to whole seconds) and renewed by a request that
	// finds it older than StoredTTL - IdleTTL, so a binding stays stored
	// for at least IdleTTL and at most 1.5 x IdleTTL (+ 1 s of rounding)
	// after the start of the last successful Route of its session (less
	// any clock skew between this process and the NATS servers; the
	// server's expiry pass may run a few hundred milliseconds late).
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
	// Without it, Hard bindings are read from the leader anyway; only Soft
	// ones and absences are served from the cache, and only while it is
	// provably fresh (MaxStaleness).
	StrictReads bool
	// MaxStaleness bounds how far behind the bucket a read served from the
	// cache may be (default and maximum 1 s, at least 40 ms): every
	// MaxStaleness/4 a probe asks the stream leader for the stream's last
	// sequence, and the cache answers only while the watch has delivered
	// the sequence a probe sent at most MaxStaleness ago saw. Otherwise
	// reads go to the leader (Stats.StaleFallbacks) until it has again.
	MaxStaleness time.Duration
	// MaxSessions bounds the entries the bucket stores: live bindings plus
	// delete/expiry markers younger than MarkerTTL (default 1,000,000;
	// negative: unbounded). The server refuses a create past it
	// (ErrFull); renewals and re-binds of stored sessions still pass.
	MaxSessions int64
	// MaxBytes bounds the bucket's size on the server (default 1 GiB;
	// negative: unbounded). Past it the server refuses new writes
	// (ErrFull).
	MaxBytes int64
	// KeepLimits leaves an existing bucket's MaxSessions and MaxBytes as
	// they are (a bucket this Table creates still gets them): the process
	// that owns the bucket's configuration decides (the router replica,
	// with --update-streams).
	KeepLimits bool
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
	case session.Unset:
		c.DefaultMode = session.Hard
	case session.Hard, session.Soft:
	default:
		return fmt.Errorf("%w: Config.DefaultMode %s", session.ErrUnknownMode, c.DefaultMode)
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
	if c.MaxStaleness <= 0 {
		c.MaxStaleness = DefaultMaxStaleness
	}
	if c.MaxStaleness < MinMaxStaleness || c.MaxStaleness > DefaultMaxStaleness {
		return fmt.Errorf("bindings: Config.MaxStaleness %v outside [%v, %v]", c.MaxStaleness, MinMaxStaleness, DefaultMaxStaleness)
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Table is one router replica's handle on the bindings bucket. It is safe
// for concurrent use. Route is the commit protocol.
type Table struct {
	cfg        Config
	js         jetstream.JetStream
	nc         *nats.Conn
	kv         jetstream.KeyValue
	kvPre      string // "$KV.<bucket>."
	stream     string // "KV_<bucket>"
	msgGetSubj string // "$JS.API.STREAM.MSG.GET.KV_<bucket>"
	// directGetPre is "$JS.API.DIRECT.GET.KV_<bucket>." on a one-replica
	// stream, where a direct get is the leader's answer; "" otherwise.
	directGetPre string
	readTimeout  time.Duration
	// confirmReads: the stream has more than one replica, so leader reads
	// are confirmed through its majority (quorum.go).
	confirmReads bool
	msgTTL       time.Duration    // the message TTL of every binding revision: StoredTTL(IdleTTL)
	publish      jskv.PublishFunc // js.PublishMsg; tests replace it to inject faults

	cache   *cache
	flights flights
	st      counters
	reqPool sync.Pool

	proof        freshness     // how far behind the bucket the cache is
	restart      chan struct{} // the probe found the watch stalled
	probeTimeout time.Duration
	stallAfter   time.Duration

	stop      chan struct{}
	stopCtx   context.Context // ends with stop: bounds the background requests
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closed    atomic.Bool
	closeOnce sync.Once
}

// StoredTTL is the message TTL a binding revision is stored with for an
// idle TTL: 1.5 x idle, rounded up to whole seconds (per-key TTLs have
// whole-second granularity). A revision older than StoredTTL - idle is
// renewed by the next request that agrees with it, so a binding outlives
// the last request of its session by at least idle.
func StoredTTL(idle time.Duration) time.Duration {
	return (idle + idle/2 + time.Second - 1).Truncate(time.Second)
}

// Open binds to (or creates) the bucket, applies MaxSessions and MaxBytes
// to it and, unless StrictReads is set, starts the watch that feeds the
// local cache and the probe that shows it is fresh, and waits until the
// watch has delivered every existing binding. nc is the connection js runs on (nil:
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
	replicas, err := applyLimits(ctx, js, &cfg)
	if err != nil {
		return nil, err
	}
	t := &Table{
		cfg:          cfg,
		js:           js,
		nc:           nc,
		kv:           kv,
		kvPre:        "$KV." + cfg.Bucket + ".",
		stream:       "KV_" + cfg.Bucket,
		msgGetSubj:   jskv.MsgGetSubject(cfg.APIPrefix, cfg.Bucket),
		readTimeout:  min(cfg.OpTimeout, 500*time.Millisecond),
		confirmReads: replicas > 1,
		directGetPre: directGetPrefix(replicas, cfg),
		msgTTL:       StoredTTL(cfg.IdleTTL),
		publish:      js.PublishMsg,
		cache:        newCache(cfg.CacheEntries, cfg.MarkerTTL),
		flights:      flights{m: make(map[string]*flight)},

		restart:      make(chan struct{}, 1),
		probeTimeout: max(cfg.MaxStaleness/2, 100*time.Millisecond),
		stallAfter:   max(2*cfg.MaxStaleness, 500*time.Millisecond),
		stop:         make(chan struct{}),
	}
	t.stopCtx, t.cancel = context.WithCancel(context.Background())
	t.reqPool.New = func() any { return new(Requirement) }
	// The quorum key takes its slot now, while the bucket has room
	// (quorum.go); a failure here only delays it to the first probe.
	if _, err := t.mark(ctx); err != nil {
		cfg.Logger.Warn("bindings: first quorum mark failed", "bucket", cfg.Bucket, "err", err)
	}
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

// startWatch starts the watch and the probe and waits until the watch has
// delivered every existing binding.
func (t *Table) startWatch(ctx context.Context) error {
	ready := make(chan struct{})
	t.wg.Add(2)
	go t.watchLoop(ready)
	go t.probeLoop()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		t.Close()
		return fmt.Errorf("bindings: initial watch of bucket %q: %w", t.cfg.Bucket, ctx.Err())
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
		t.cancel()
		t.wg.Wait()
	})
	return nil
}

// Config returns the normalized configuration.
func (t *Table) Config() Config { return t.cfg }

func (t *Table) live(worker string) bool {
	return t.cfg.Liveness == nil || t.cfg.Liveness.Live(worker)
}

// Get returns the session's binding under the read rule of Route's first
// step (firstRead): a Hard binding from the stream leader, a Soft one or
// an absence from the cache only while it is provably fresh. ErrNotFound
// means the leader or such a cache found nothing.
func (t *Table) Get(ctx context.Context, model, session string) (Binding, error) {
	if err := validate(model, session); err != nil {
		t.st.badInput.Add(1)
		return Binding{}, err
	}
	var kbuf [maxKeyLen]byte
	kb := appendKey(kbuf[:0], model, session)
	st, err := t.firstRead(ctx, kb)
	if err == nil && !st.present && !st.leader {
		// A 404 is always the leader's word: the session may be a Hard
		// one created a moment ago through another replica, and a Hard
		// binding's reads are linearizable. (Route needs no such read:
		// its create is a CAS that fails on a binding the cache missed.)
		st, err = t.leaderRead(ctx, string(kb))
	}
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

// firstRead is step 1 of the protocol, the read rule: the stream leader
// answers under StrictReads, when the cache cannot show it is at most
// MaxStaleness behind the bucket, for a cached Hard binding (a Hard
// binding served is always the latest committed value), for an expired
// entry and for a miss once the cache is incomplete. Otherwise the cache
// answers: a Soft binding, a tombstone or a miss (absent). A create that
// follows an absence is a CAS, so an absence the cache has not seen yet
// fails safely on the conflict and is re-read from the leader.
func (t *Table) firstRead(ctx context.Context, kb []byte) (readState, error) {
	if t.cfg.StrictReads {
		return t.leaderRead(ctx, string(kb))
	}
	now := time.Now()
	if !t.cacheFresh(now) {
		t.st.staleFallbacks.Add(1)
		return t.leaderRead(ctx, string(kb))
	}
	st, ok := t.cache.get(kb)
	switch {
	case ok && st.present && st.bad == nil && st.rec.Mode == session.Hard:
		t.st.hardReads.Add(1)
		if t.confirmReads && t.confirmCached(ctx, string(kb), st.rev) {
			return st, nil // the cached revision is the latest: one quorum write, no leader read
		}
	case ok && !st.present && t.cache.dead(&st, now):
		// The server has dropped the marker too: nothing is stored.
		return readState{}, nil
	case ok && (!st.present || st.live(now)):
		return st, nil
	case !ok && !t.cache.incomplete.Load():
		return readState{}, nil
	}
	return t.leaderRead(ctx, string(kb))
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
		st, err := t.leaderRead(ctx, key)
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
