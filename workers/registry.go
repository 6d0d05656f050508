package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/jskv"
)

// Registry defaults.
const (
	DefaultBucket    = "kvr-workers"
	DefaultTTL       = 3 * time.Second // per-key TTL of a registration
	DefaultHeartbeat = time.Second     // renewal period
	// DefaultMarkerTTL is the bucket's LimitMarkerTTL (how long the server
	// keeps the marker left by an expired key) and the TTL of the purge
	// marker Deregister leaves, so that ids that never come back do not
	// accumulate tombstones.
	DefaultMarkerTTL = time.Minute
	// DefaultDepartureGrace is how long a membership view waits, after a
	// worker's key vanished without a deregistration (it expired or was
	// purged), for the key to come back before it confirms the departure.
	// A failover of the registry stream stalls writes for longer than the
	// TTL (3.8-8.1 s measured in issue 15, with every key expiring at once
	// and coming back 12-14 ms after the new leader took over; a watch
	// consumer on the failed node may deliver the return as late as the
	// stall itself): 15 s is about twice the longest stall seen.
	DefaultDepartureGrace = 15 * time.Second
)

// deregisterNote is the body of the purge marker Deregister writes. The
// server's own expiry marker has no body, so a membership view tells an
// explicit departure (confirmed at once) from an expiry (suspect until
// DepartureGrace passes) by it: KV watch entries carry no headers.
var deregisterNote = []byte(`{"departure":"deregistered"}`)

// Errors of the registry. Match with errors.Is.
var (
	// ErrConfig: a RegistryConfig field is out of range.
	ErrConfig = errors.New("workers: invalid registry config")
	// ErrBucketConfig: the bucket exists but cannot carry per-key TTLs
	// safely (no LimitMarkerTTL, or History > 1 where an expired revision
	// would let an older one resurface).
	ErrBucketConfig = errors.New("workers: registry bucket misconfigured")
	// ErrConflict: a compare-and-set write lost (server codes 10071 or
	// 10164). The concrete error is a *ConflictError.
	ErrConflict = errors.New("workers: registry compare-and-set conflict")
	// ErrDuplicateWorker: another incarnation (another epoch) holds the
	// worker's key. The concrete error is a *DuplicateError.
	ErrDuplicateWorker = errors.New("workers: worker id held by another incarnation")
	// ErrStopped: the registration was stopped or deregistered.
	ErrStopped = errors.New("workers: registration stopped")
)

// ConflictError is a lost compare-and-set on a registry key. Raw JetStream
// publishes are not mapped by nats.go; internal/jskv maps the server codes
// and Err is its *jskv.ConflictError (which also matches jskv.ErrConflict
// and the server's *jetstream.APIError).
type ConflictError struct {
	Key      string
	Expected uint64 // the revision the write expected to replace
	Code     jetstream.ErrorCode
	Err      error
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("workers: key %q changed since revision %d (server code %d): %v", e.Key, e.Expected, e.Code, e.Err)
}

// Unwrap matches ErrConflict and the server's *jetstream.APIError.
func (e *ConflictError) Unwrap() []error { return []error{ErrConflict, e.Err} }

// asConflict maps a raw publish error carrying code 10071 (wrong last
// sequence) or 10164 (the same, on replicated streams while another write
// to the subject is in flight) to a *ConflictError (jskv.AsConflict
// decides); other errors pass.
func asConflict(key string, expected uint64, err error) error {
	var ce *jskv.ConflictError
	if errors.As(jskv.AsConflict(err), &ce) {
		return &ConflictError{Key: key, Expected: expected, Code: ce.Code, Err: ce}
	}
	return err
}

// DuplicateError says that a worker's key is held by another incarnation:
// a second process with the same id, or a newer start of this worker that
// took the key over.
type DuplicateError struct {
	Key      string
	Ours     Info
	Theirs   Info   // zero when the value there is not a valid Info
	Revision uint64 // revision of their entry
	Reason   string
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("workers: worker %q (epoch %d): key %q held by epoch %d at revision %d (endpoint %q): %s",
		e.Ours.ID, e.Ours.Epoch, e.Key, e.Theirs.Epoch, e.Revision, e.Theirs.Endpoint, e.Reason)
}

// Unwrap matches ErrDuplicateWorker.
func (e *DuplicateError) Unwrap() error { return ErrDuplicateWorker }

// RegistryConfig configures both sides of the registry: Register (worker)
// and WatchMembership (router). Zero fields take the defaults.
type RegistryConfig struct {
	Bucket    string        // KV bucket; DefaultBucket
	Replicas  int           // replicas when this process creates the bucket; 1
	TTL       time.Duration // per-key TTL, whole seconds, >= 1 s; DefaultTTL
	Heartbeat time.Duration // renewal period, < TTL; DefaultHeartbeat
	MarkerTTL time.Duration // bucket LimitMarkerTTL and purge-marker TTL, >= 1 s; DefaultMarkerTTL
	// OpTimeout bounds one registry write made by the heartbeat loop;
	// default Heartbeat.
	OpTimeout time.Duration
	// APIPrefix (worker side) is the JetStream API prefix of the leader
	// reads that resolve a conflict; default "$JS.API". Set it, like js's
	// own, when js uses a domain ("$JS.<domain>.API") or a custom prefix.
	APIPrefix string

	// TakeOver (worker side): when the key is held by another epoch,
	// overwrite it at once instead of waiting up to TTL for it to expire.
	// Use it only where the id is known to be unique to this process (a
	// restarted pod with a stable name); a live holder then loses its key
	// on its next heartbeat and stops with ErrDuplicateWorker.
	TakeOver bool
	// OnRecreate (worker side) is called (from the heartbeat goroutine, or
	// from SetState if that write found the key gone) after the key had
	// vanished (it expired during a pause longer than the TTL, or someone
	// deleted it) and was created again. Routers held the worker suspect
	// meanwhile; if the key was gone for longer than their DepartureGrace
	// (or was deleted, not expired) they departed it and dropped what their
	// indexes held for it: an engine may re-announce its cache here, or
	// accept that routers under-estimate its overlap until it refills.
	OnRecreate func(Info)

	// Model (router side): when set, the membership view only reports
	// workers of this model.
	Model string
	// DepartureGrace (router side) is how long a worker whose key vanished
	// without a deregistration stays suspect (live, not available) before
	// its departure is confirmed; DefaultDepartureGrace; negative means no
	// grace (the key's expiry is a departure at once).
	DepartureGrace time.Duration

	Logger *slog.Logger // default slog.Default()
}

func (c RegistryConfig) withDefaults() (RegistryConfig, error) {
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.MarkerTTL == 0 {
		c.MarkerTTL = DefaultMarkerTTL
	}

	if c.OpTimeout == 0 {
		c.OpTimeout = c.Heartbeat
	}
	if c.APIPrefix == "" {
		c.APIPrefix = jskv.DefaultAPIPrefix
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.Replicas < 1 || c.Replicas > 5:
		return c, fmt.Errorf("%w: Replicas %d, want 1..5", ErrConfig, c.Replicas)
	case c.TTL < time.Second || c.TTL%time.Second != 0:
		// The server keeps per-message TTLs in whole seconds, minimum 1 s.
		return c, fmt.Errorf("%w: TTL %v, want whole seconds >= 1s", ErrConfig, c.TTL)
	case c.Heartbeat <= 0 || c.Heartbeat >= c.TTL:
		return c, fmt.Errorf("%w: Heartbeat %v, want > 0 and < TTL %v", ErrConfig, c.Heartbeat, c.TTL)
	case c.MarkerTTL < time.Second || c.MarkerTTL%time.Second != 0:
		return c, fmt.Errorf("%w: MarkerTTL %v, want whole seconds >= 1s", ErrConfig, c.MarkerTTL)
	case c.OpTimeout <= 0:
		return c, fmt.Errorf("%w: OpTimeout %v, want > 0", ErrConfig, c.OpTimeout)
	}
	return c, nil
}

// departureGrace is DepartureGrace with its default applied (0 = none).
func (c RegistryConfig) departureGrace() time.Duration {
	switch {
	case c.DepartureGrace == 0:
		return DefaultDepartureGrace
	case c.DepartureGrace < 0:
		return 0
	}
	return c.DepartureGrace
}

// EnsureBucket binds to the registry bucket, creating it with History 1
// and LimitMarkerTTL when it does not exist, and checks that an existing
// bucket can carry per-key TTLs. It never changes an existing bucket (the
// router replica owns its configuration: OwnBucket).
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig) (jetstream.KeyValue, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return ensureBucket(ctx, js, cfg)
}

// OwnBucket is the set-up of the bucket's owner, the router replica: as
// EnsureBucket, creating a missing bucket with cfg.Replicas and maxBytes
// (0: unlimited; the bucket discards new: once full, registrations fail
// and live keys stay), and verifying an existing one against them as owner
// says (report each difference or update: jskv.Reconcile).
func OwnBucket(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig, maxBytes int64, owner jskv.Owner) (jetstream.KeyValue, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return setUpBucket(ctx, js, cfg, maxBytes, &owner)
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig) (jetstream.KeyValue, error) {
	return setUpBucket(ctx, js, cfg, 0, nil)
}

func setUpBucket(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig, maxBytes int64, owner *jskv.Owner) (jetstream.KeyValue, error) {
	kv, err := jskv.EnsureBucket(ctx, js, jskv.BucketConfig{
		Bucket:      cfg.Bucket,
		Description: "kvrouter worker registry: one key per worker id, per-key TTL leases",
		Replicas:    cfg.Replicas,
		MarkerTTL:   cfg.MarkerTTL,
		MaxBytes:    maxBytes,
		Owner:       owner,
	})
	switch {
	case errors.Is(err, jskv.ErrBucketConfig):
		return nil, fmt.Errorf("%w: %w", ErrBucketConfig, err)
	case err != nil:
		return nil, fmt.Errorf("workers: registry: %w", err)
	}
	return kv, nil
}

// Registration is one worker's entry in the registry and the heartbeat
// that keeps it alive. Methods are safe for concurrent use.
//
// Lifecycle: Register creates the key and starts the heartbeat. The
// heartbeat ends on Stop (the key is left to expire within TTL, as after a
// crash), on Deregister (the key is deleted), or when another incarnation
// is found holding the key: then Err returns a *DuplicateError, Done is
// closed, and the worker should stop serving under this id.
type Registration struct {
	cfg     RegistryConfig
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	id      string // immutable copy of info.ID
	key     string
	subject string
	log     *slog.Logger

	wmu sync.Mutex // serialises registry writes (heartbeat, SetState, Deregister)

	mu      sync.Mutex // guards the fields below
	info    Info
	val     []byte
	rev     uint64
	lost    error // set once another incarnation holds the key
	stopped bool

	cancel   context.CancelFunc
	done     chan struct{}
	stopOnce sync.Once

	renewals, failures, conflicts, recreated atomic.Uint64
}

// RegistrationStats counts heartbeat outcomes.
type RegistrationStats struct {
	Renewals  uint64 // successful writes by the heartbeat
	Failures  uint64 // writes that failed and were retried
	Conflicts uint64 // compare-and-set conflicts seen (then resolved or fatal)
	Recreated uint64 // times the key had vanished and was created again
}

// Register claims the worker's key and starts its heartbeat. A zero Epoch
// is replaced by NewEpoch() and an empty State by StateReady; Info()
// returns what was registered. ctx bounds the registration only; the
// heartbeat runs until Stop or Deregister.
//
// If the key is held by another epoch, Register waits (bounded by TTL +
// Heartbeat, and by ctx) for it to expire, as it does after a crash and
// quick restart; if it is renewed meanwhile, a live process has the same id
// and Register fails with a *DuplicateError. With cfg.TakeOver it
// overwrites the key at once. A Register ended by ctx deletes the key if
// its own write landed, so a worker stopped while registering leaves none.
// A create that no stream server answers (the bucket's stream has no
// leader: just created, or electing one after a node failed) is retried
// for up to claimUnavailableWait.
func Register(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig, info Info) (*Registration, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	info = info.Clone()
	if info.State == "" {
		info.State = StateReady
	}
	if info.Epoch == 0 {
		info.Epoch = NewEpoch()
	}
	val, err := EncodeInfo(info)
	if err != nil {
		return nil, err
	}
	kv, err := ensureBucket(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	key := KeyFor(info.ID)
	r := &Registration{
		cfg:     cfg,
		js:      js,
		kv:      kv,
		id:      info.ID,
		key:     key,
		subject: "$KV." + cfg.Bucket + "." + key,
		log:     cfg.Logger.With("component", "workers.registration", "worker", info.ID, "epoch", info.Epoch),
		info:    info,
		val:     val,
		done:    make(chan struct{}),
	}
	rev, err := r.claim(ctx)
	if err != nil {
		if ctx.Err() != nil {
			r.abandon(ctx)
		}
		return nil, err
	}
	r.rev = rev
	loopCtx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.loop(loopCtx)
	r.log.Debug("registered", "key", key, "revision", rev, "ttl", cfg.TTL)
	return r, nil
}

// abandon deletes the key of a Register cancelled mid-claim if this
// incarnation wrote it: the create may have landed with its reply lost to
// the cancellation, and the caller, holding no Registration, could not
// deregister it (it would linger for TTL as a live worker nobody serves).
// Best effort, under a fresh timeout like Drain's cleanup.
func (r *Registration) abandon(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainCleanupTimeout)
	defer cancel()
	e, err := r.readLatest(cctx)
	if err != nil {
		return // gone, never written, or unreadable: the TTL is the backstop
	}
	if theirs, derr := DecodeInfo(e.value); derr != nil || theirs.ID != r.info.ID || theirs.Epoch != r.info.Epoch {
		return
	}
	if _, err := r.publishDeregister(cctx, e.rev); err != nil {
		r.log.Warn("registration cancelled; its key was written and could not be deleted (it expires within the TTL)", "err", err)
	}
}

// claimUnavailableWait bounds how long claim retries a create that no
// stream server answered: a registry stream's failover stalls writes for
// up to 8.1 s (issue 15, DefaultDepartureGrace), and a new R3 bucket's
// stream takes a moment to elect its leader and be heard across the
// cluster.
const claimUnavailableWait = 15 * time.Second

// claim creates the key, or resolves an existing one (see Register).
func (r *Registration) claim(ctx context.Context) (uint64, error) {
	deadline := time.Now().Add(r.cfg.TTL + r.cfg.Heartbeat + 500*time.Millisecond)
	var waitingOn uint64      // revision of the other incarnation's entry we wait on
	var unavailable time.Time // when creates began to go unanswered
	backoff := 20 * time.Millisecond
	for {
		rev, err := r.kv.Create(ctx, r.key, r.val, jetstream.KeyTTL(r.cfg.TTL))
		if err == nil {
			return rev, nil
		}
		if streamUnavailable(err) {
			if unavailable.IsZero() {
				unavailable = time.Now()
			}
			// A create that landed unanswered comes back as ErrKeyExists
			// holding our own value, resolved below.
			if time.Since(unavailable) < claimUnavailableWait {
				if err := sleepCtx(ctx, backoff); err != nil {
					return 0, fmt.Errorf("workers: register %q: %w", r.info.ID, err)
				}
				backoff = min(2*backoff, 500*time.Millisecond)
				continue
			}
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, fmt.Errorf("workers: register %q: create key %q: %w", r.info.ID, r.key, err)
		}
		e, err := r.readLatest(ctx)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
				return 0, fmt.Errorf("workers: register %q: %w", r.info.ID, err)
			}
			continue // it vanished between Create and Get
		}
		if err != nil {
			return 0, fmt.Errorf("workers: register %q: read key %q: %w", r.info.ID, r.key, err)
		}
		theirs, derr := DecodeInfo(e.value)
		if derr == nil && theirs.ID == r.info.ID && theirs.Epoch == r.info.Epoch {
			return e.rev, nil // our own create whose reply was lost
		}
		if r.cfg.TakeOver {
			rev, err := r.publish(ctx, e.rev, r.val)
			if errors.Is(err, ErrConflict) {
				continue
			}
			if err != nil {
				return 0, fmt.Errorf("workers: register %q: take over key %q: %w", r.info.ID, r.key, err)
			}
			r.log.Warn("took over the key of another incarnation", "their_epoch", theirs.Epoch, "their_endpoint", theirs.Endpoint)
			return rev, nil
		}
		dup := &DuplicateError{Key: r.key, Ours: r.info.Clone(), Theirs: theirs, Revision: e.rev}
		switch {
		case waitingOn != 0 && e.rev != waitingOn:
			dup.Reason = "renewed while waiting for it to expire: a live process uses this id"
			return 0, dup
		case time.Now().After(deadline):
			dup.Reason = fmt.Sprintf("did not expire within %v (written without TTL?); set TakeOver if this id is yours",
				r.cfg.TTL+r.cfg.Heartbeat)
			return 0, dup
		case waitingOn == 0:
			r.log.Info("worker id is registered by another epoch; waiting for its key to expire",
				"their_epoch", theirs.Epoch, "their_endpoint", theirs.Endpoint, "max_wait", r.cfg.TTL+r.cfg.Heartbeat)
		}
		waitingOn = e.rev
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return 0, fmt.Errorf("workers: register %q: waiting for key %q to expire: %w", r.info.ID, r.key, err)
		}
	}
}

// publish writes val with a compare-and-set on expect and a fresh
// per-message TTL. kv.Update cannot be used: it drops the key's TTL.
func (r *Registration) publish(ctx context.Context, expect uint64, val []byte) (uint64, error) {
	rev, err := jskv.Publish(ctx, r.js, &nats.Msg{Subject: r.subject, Data: val}, expect, r.cfg.TTL)
	if err != nil {
		return 0, asConflict(r.key, expect, err)
	}
	return rev, nil
}

// write renews the key with the current value. On a conflict it re-reads
// the key: gone → create it again; our own incarnation (a write whose
// acknowledgement was lost) → adopt its revision and retry; anything else →
// another incarnation holds it, which is final.
func (r *Registration) write(ctx context.Context) error {
	r.wmu.Lock()
	recreated, err := r.writeLocked(ctx)
	r.wmu.Unlock()
	// The hook runs outside wmu so that it may call SetState.
	if recreated && r.cfg.OnRecreate != nil {
		r.cfg.OnRecreate(r.Info())
	}
	return err
}

func (r *Registration) writeLocked(ctx context.Context) (recreated bool, err error) {
	for attempt := 0; attempt < 3; attempt++ {
		r.mu.Lock()
		val, rev, lost, stopped, info := r.val, r.rev, r.lost, r.stopped, r.info
		r.mu.Unlock()
		if lost != nil {
			return false, lost
		}
		if stopped {
			return false, ErrStopped
		}
		newRev, err := r.publish(ctx, rev, val)
		if err == nil {
			r.setRev(newRev)
			return false, nil
		}
		if !errors.Is(err, ErrConflict) {
			return false, fmt.Errorf("workers: renew %q: %w", r.key, err)
		}
		r.conflicts.Add(1)
		e, err := r.readLatest(ctx)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			newRev, err := r.kv.Create(ctx, r.key, val, jetstream.KeyTTL(r.cfg.TTL))
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // someone created it meanwhile: look again
			}
			if err != nil {
				return false, fmt.Errorf("workers: re-create %q: %w", r.key, err)
			}
			r.setRev(newRev)
			r.recreated.Add(1)
			r.log.Warn("registry key had vanished (expired or deleted); created it again", "revision", newRev)
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("workers: renew %q: re-read after conflict: %w", r.key, err)
		}
		theirs, derr := DecodeInfo(e.value)
		if derr == nil && theirs.ID == info.ID && theirs.Epoch == info.Epoch {
			r.setRev(e.rev)
			continue
		}
		reason := "another incarnation wrote the key; this one stops renewing"
		if derr != nil {
			reason = "the key holds a value that is not a valid worker info (" + derr.Error() + "); this one stops renewing"
		}
		dup := &DuplicateError{Key: r.key, Ours: info.Clone(), Theirs: theirs, Revision: e.rev, Reason: reason}
		r.mu.Lock()
		r.lost = dup
		r.mu.Unlock()
		r.log.Error("lost the registry key to another incarnation", "err", dup)
		return false, dup
	}
	return false, fmt.Errorf("workers: renew %q: %w: still conflicting after 3 attempts", r.key, ErrConflict)
}

func (r *Registration) setRev(rev uint64) {
	r.mu.Lock()
	r.rev = rev
	r.mu.Unlock()
}

// loop renews the key every Heartbeat; after a failed write it retries
// sooner (Heartbeat/4) so that a short outage does not cost the lease.
func (r *Registration) loop(ctx context.Context) {
	defer close(r.done)
	t := time.NewTimer(r.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		opCtx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
		err := r.write(opCtx)
		cancel()
		// Keep the period at Heartbeat however long the write took.
		next := max(r.cfg.Heartbeat-time.Since(began), 0)
		switch {
		case err == nil:
			r.renewals.Add(1)
		case errors.Is(err, ErrDuplicateWorker), errors.Is(err, ErrStopped), ctx.Err() != nil:
			return
		default:
			r.failures.Add(1)
			r.log.Warn("heartbeat failed; retrying", "err", err)
			next = max(r.cfg.Heartbeat/4, 10*time.Millisecond)
		}
		t.Reset(next)
	}
}

// Info returns the registered info (with its current State).
func (r *Registration) Info() Info {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.info.Clone()
}

// Key returns the registry key.
func (r *Registration) Key() string { return r.key }

// Revision returns the revision of the last write this registration made.
func (r *Registration) Revision() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rev
}

// Err returns the *DuplicateError once another incarnation holds the key,
// else nil.
func (r *Registration) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

// Done is closed when the heartbeat has ended (Stop, Deregister, or a lost
// key: check Err).
func (r *Registration) Done() <-chan struct{} { return r.done }

// Stats returns heartbeat counters.
func (r *Registration) Stats() RegistrationStats {
	return RegistrationStats{
		Renewals:  r.renewals.Load(),
		Failures:  r.failures.Load(),
		Conflicts: r.conflicts.Load(),
		Recreated: r.recreated.Load(),
	}
}

// SetState changes the worker's state and writes it at once. On a
// transient failure the new state is kept and the heartbeat keeps trying
// to write it; the error is returned. A drain deadline is cleared (and
// StateDraining set this way has none: see SetDrainingUntil).
func (r *Registration) SetState(ctx context.Context, s State) error {
	return r.setState(ctx, s, time.Time{})
}

func (r *Registration) setState(ctx context.Context, s State, deadline time.Time) error {
	if !s.Valid() {
		return &InfoError{ID: r.id, Field: "state", Reason: fmt.Sprintf("%q, want %q, %q or %q", s, StateReady, StateDraining, StateUnavailable)}
	}
	return r.update(ctx, func(i *Info) bool {
		i.State, i.DrainDeadline = s, deadline
		return true
	})
}

// update applies change to a copy of the worker's info and, when change
// reports a change, makes it the registered value and writes it at once.
// On a transient failure the new value is kept and the heartbeat keeps
// trying to write it; the error is returned.
func (r *Registration) update(ctx context.Context, change func(*Info) bool) error {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return ErrStopped
	}
	info := r.info.Clone()
	if !change(&info) {
		r.mu.Unlock()
		return nil
	}
	val, err := EncodeInfo(info)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	r.info, r.val = info, val
	r.mu.Unlock()
	return r.write(ctx)
}

// SetDraining marks the worker draining without a deadline: still live
// (its cache and bindings stay valid), routers stop choosing it for new
// sessions and unbound work but keep sending it the requests of Hard
// sessions bound to it, until it deregisters.
func (r *Registration) SetDraining(ctx context.Context) error { return r.SetState(ctx, StateDraining) }

// SetDrainingUntil is SetDraining with a deadline (Info.DrainDeadline): at
// that time every router replica confirms the worker's departure, even if
// its key is still there, and the sessions bound to it re-bind. A zero
// deadline is SetDraining.
func (r *Registration) SetDrainingUntil(ctx context.Context, deadline time.Time) error {
	return r.setState(ctx, StateDraining, deadline.Round(0))
}

// Stop ends the heartbeat without touching the key, which then expires
// within TTL as if the worker had crashed. It waits for the heartbeat
// goroutine to exit. Idempotent.
func (r *Registration) Stop() {
	r.stopOnce.Do(func() {
		r.mu.Lock()
		r.stopped = true
		r.mu.Unlock()
		r.cancel()
	})
	<-r.done
}

// Deregister stops the heartbeat and deletes the key (a purge whose marker
// expires after MarkerTTL and carries deregisterNote), so routers confirm
// the worker's departure at once, without DepartureGrace. It never
// deletes a key that another incarnation holds: it returns the
// *DuplicateError instead. A key that is already gone is success. If the
// delete fails, the key still expires within TTL.
func (r *Registration) Deregister(ctx context.Context) error {
	r.Stop()
	r.wmu.Lock()
	defer r.wmu.Unlock()
	for attempt := 0; attempt < 3; attempt++ {
		r.mu.Lock()
		rev, lost, info := r.rev, r.lost, r.info
		r.mu.Unlock()
		if lost != nil {
			return lost
		}
		_, err := r.publishDeregister(ctx, rev)
		if err == nil {
			r.log.Debug("deregistered", "revision", rev)
			return nil
		}
		if !errors.Is(err, ErrConflict) {
			return fmt.Errorf("workers: deregister %q: %w", r.key, err)
		}
		e, err := r.readLatest(ctx)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("workers: deregister %q: re-read after conflict: %w", r.key, err)
		}
		theirs, derr := DecodeInfo(e.value)
		if derr == nil && theirs.ID == info.ID && theirs.Epoch == info.Epoch {
			r.setRev(e.rev)
			continue
		}
		return &DuplicateError{Key: r.key, Ours: info.Clone(), Theirs: theirs, Revision: e.rev,
			Reason: "another incarnation holds the key; left it in place"}
	}
	return fmt.Errorf("workers: deregister %q: %w: still conflicting after 3 attempts", r.key, ErrConflict)
}

// publishDeregister writes what kv.Purge(LastRevision(rev), PurgeTTL)
// writes, plus deregisterNote as the body, which kv.Purge cannot carry.
func (r *Registration) publishDeregister(ctx context.Context, rev uint64) (uint64, error) {
	m := &nats.Msg{Subject: r.subject, Data: deregisterNote, Header: nats.Header{}}
	m.Header.Set("KV-Operation", "PURGE")
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	newRev, err := jskv.Publish(ctx, r.js, m, rev, r.cfg.MarkerTTL)
	if err != nil {
		return 0, asConflict(r.key, rev, err)
	}
	return newRev, nil
}

// latest is the last message of a registry key.
type latest struct {
	value []byte
	rev   uint64
}

// readLatest reads the key's last value from the stream leader
// (jskv.LastMsg: $JS.API.STREAM.MSG.GET, under cfg.APIPrefix). kv.Get is a
// direct get that any replica may answer from a lagging state; deciding
// "another incarnation holds my key" on a stale read would make a healthy
// worker give up its id. A key whose last message is a delete, purge or
// expiry marker is ErrKeyNotFound.
func (r *Registration) readLatest(ctx context.Context) (latest, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	m, err := jskv.LastMsg(ctx, r.js.Conn(), jskv.MsgGetSubject(r.cfg.APIPrefix, r.cfg.Bucket), r.subject)
	switch {
	case errors.Is(err, jskv.ErrNoMessage):
		return latest{}, fmt.Errorf("workers: key %q: %w", r.key, jetstream.ErrKeyNotFound)
	case err != nil:
		return latest{}, fmt.Errorf("workers: read key %q from the stream leader: %w", r.key, err)
	case m.Tombstone():
		return latest{}, fmt.Errorf("workers: key %q deleted or expired: %w", r.key, jetstream.ErrKeyNotFound)
	}
	return latest{value: m.Data, rev: m.Seq}, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// streamUnavailable reports an error saying that no server of the
// bucket's stream answered a write.
func streamUnavailable(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}
