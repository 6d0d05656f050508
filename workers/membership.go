package workers

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Callbacks receive membership changes. They are called one at a time, in
// bucket order, from the view's goroutine, after the view's own state has
// changed (so a callback may call the view). A slow callback delays the
// view. nil callbacks are skipped.
//
// The view follows the latest state of each key, not every write: the
// bucket keeps one revision per key, so a revision replaced before the
// watch delivered it is never seen. Callbacks report transitions between
// the states the view did see (a worker that registered and deregistered
// within a few milliseconds may produce no callback at all; a restart
// whose departure was overwritten still shows as OnDepart(old)+OnJoin(new)
// because epochs are compared).
type Callbacks struct {
	// OnJoin: a worker (incarnation) appeared.
	OnJoin func(Info)
	// OnUpdate: a known incarnation changed its info (state, labels,
	// capacity...). Heartbeats that rewrite the same value call nothing.
	OnUpdate func(Info)
	// OnDepart: the incarnation is gone: its key was deleted or expired, or
	// a new epoch replaced it. Drop everything held for it.
	//
	// A re-incarnation (same id, new epoch) is reported as OnDepart(old)
	// followed by OnJoin(new), so a consumer that drops a worker's index
	// entries on depart needs no special case. During that OnDepart the
	// view already holds the new incarnation: Get(id) returns an Info with
	// another Epoch, which tells a restart from a real departure (where
	// Live(id) is false).
	OnDepart func(Info)
}

// MembershipStats counts what the view has seen.
type MembershipStats struct {
	Joins, Updates, Departs uint64
	Restarts                uint64 // re-incarnations (also counted in Departs and Joins)
	Malformed               uint64 // entries ignored because they failed to decode or validate
	Filtered                uint64 // valid entries of another model, ignored
}

// Membership is the router's view of the registry, fed by a KV watch.
// Methods are safe for concurrent use.
type Membership struct {
	cfg Callbacks
	rc  RegistryConfig
	log *slog.Logger
	w   jetstream.KeyWatcher
	// cancel ends the watcher's context (nats.go then unsubscribes).
	cancel context.CancelFunc

	mu      sync.RWMutex
	members map[string]*member // by registry key
	bad     map[string]bool    // keys whose latest value was malformed (log once)

	ready     chan struct{}
	readyOnce sync.Once
	done      chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once

	joins, updates, departs, restarts, malformed, filtered atomic.Uint64
}

type member struct {
	info Info
	raw  []byte // last value, to skip decoding identical heartbeats
	rev  uint64
}

// WatchMembership starts a view of the registry. The view loads the
// current entries (WaitReady returns once it has), then follows changes
// until Stop is called; ctx bounds the setup only. Only cfg.Bucket, cfg.Model and
// cfg.Logger matter here (plus creating the bucket if it is missing, with
// the registry settings, so routers may start before any worker).
func WatchMembership(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig, cb Callbacks) (*Membership, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	kv, err := ensureBucket(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	// The watcher lives until Stop, not until ctx ends: nats.go unsubscribes
	// when the context given to the watch is done, so it gets a context of
	// its own that ctx cancels only while the watch is being set up.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopSetup := context.AfterFunc(ctx, cancel)
	w, err := kv.WatchAll(wctx)
	stopSetup()
	if err == nil && wctx.Err() != nil {
		err = ctx.Err()
		_ = w.Stop()
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("workers: watch registry bucket %q: %w", cfg.Bucket, err)
	}
	m := &Membership{
		cfg:     cb,
		rc:      cfg,
		log:     cfg.Logger.With("component", "workers.membership", "bucket", cfg.Bucket),
		w:       w,
		cancel:  cancel,
		members: make(map[string]*member),
		bad:     make(map[string]bool),
		ready:   make(chan struct{}),
		done:    make(chan struct{}),
		stop:    make(chan struct{}),
	}
	go m.run()
	return m, nil
}

func (m *Membership) run() {
	defer close(m.done)
	defer m.cancel()
	updates := m.w.Updates()
	for {
		select {
		case <-m.stop:
			m.shutdown(updates)
			return
		case e, ok := <-updates:
			if !ok {
				// The subscription closed under us (the connection closed):
				// the view is frozen at its last state.
				m.log.Error("registry watch ended; membership view no longer follows the registry")
				return
			}
			m.apply(e)
		}
	}
}

// shutdown stops the watcher and drains its channel until it is closed:
// the watcher's delivery callback blocks on a full channel while holding
// the lock its close handler needs.
func (m *Membership) shutdown(updates <-chan jetstream.KeyValueEntry) {
	_ = m.w.Stop()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case _, ok := <-updates:
			if !ok {
				return
			}
		case <-t.C:
			m.log.Warn("registry watcher did not close within 5s")
			return
		}
	}
}

// apply folds one watch entry into the view and calls the callbacks.
func (m *Membership) apply(e jetstream.KeyValueEntry) {
	if e == nil { // end of the initial snapshot
		m.readyOnce.Do(func() { close(m.ready) })
		return
	}
	key := e.Key()
	m.mu.Lock()
	prev := m.members[key]
	if e.Operation() != jetstream.KeyValuePut {
		delete(m.bad, key)
		if prev == nil {
			m.mu.Unlock()
			return
		}
		reason := "deleted"
		if e.Operation() == jetstream.KeyValuePurge {
			reason = "expired or purged"
		}
		m.departAndUnlock(key, prev, reason)
		return
	}
	if prev != nil && bytes.Equal(prev.raw, e.Value()) { // a heartbeat
		prev.rev = e.Revision()
		m.mu.Unlock()
		return
	}
	info, err := DecodeInfo(e.Value())
	if err == nil && KeyFor(info.ID) != key {
		err = &InfoError{ID: info.ID, Field: "id", Reason: fmt.Sprintf("stored under key %q, want %q", key, KeyFor(info.ID))}
	}
	if err != nil {
		// Ignore the entry and keep what we had: the key still exists, so
		// a known worker stays known until its key goes.
		m.malformed.Add(1)
		first := !m.bad[key]
		m.bad[key] = true
		m.mu.Unlock()
		if first {
			m.log.Warn("ignoring malformed registry entry", "key", key, "revision", e.Revision(), "err", err)
		}
		return
	}
	delete(m.bad, key)
	if m.rc.Model != "" && info.Model != m.rc.Model {
		m.filtered.Add(1)
		if prev == nil {
			m.mu.Unlock()
			return
		}
		// It moved to another model: gone from this view.
		m.departAndUnlock(key, prev, "moved to model "+strconv.Quote(info.Model))
		return
	}
	cur := &member{info: info, raw: bytes.Clone(e.Value()), rev: e.Revision()}
	m.members[key] = cur
	m.mu.Unlock()
	switch {
	case prev == nil:
		m.joins.Add(1)
		m.log.Info("worker joined", "worker", info.ID, "epoch", info.Epoch, "model", info.Model, "state", info.State)
		call(m.cfg.OnJoin, info)
	case prev.info.Epoch != info.Epoch:
		m.restarts.Add(1)
		m.departs.Add(1)
		m.joins.Add(1)
		m.log.Info("worker restarted", "worker", info.ID, "old_epoch", prev.info.Epoch, "epoch", info.Epoch)
		call(m.cfg.OnDepart, prev.info)
		call(m.cfg.OnJoin, info)
	case !prev.info.Equal(info):
		m.updates.Add(1)
		if prev.info.State != info.State {
			m.log.Info("worker state changed", "worker", info.ID, "from", prev.info.State, "to", info.State)
		}
		call(m.cfg.OnUpdate, info)
	}
}

// departAndUnlock removes key's member prev from the view, releases m.mu
// (held by the caller), and then counts, logs and reports the departure, so
// that OnDepart runs without the lock like every callback.
func (m *Membership) departAndUnlock(key string, prev *member, reason string) {
	delete(m.members, key)
	m.mu.Unlock()
	m.departs.Add(1)
	m.log.Info("worker departed", "worker", prev.info.ID, "epoch", prev.info.Epoch, "reason", reason)
	call(m.cfg.OnDepart, prev.info)
}

// call hands f a private copy so callbacks cannot alter the view.
func call(f func(Info), i Info) {
	if f != nil {
		f(i.Clone())
	}
}

// WaitReady returns once the entries that existed when the view started
// have been loaded (and their OnJoin calls made), or with ctx's error.
func (m *Membership) WaitReady(ctx context.Context) error {
	select {
	case <-m.ready:
		return nil
	case <-m.done:
		select {
		case <-m.ready:
			return nil
		default:
		}
		return fmt.Errorf("workers: membership view stopped before its initial load: %w", ErrStopped)
	case <-ctx.Done():
		return fmt.Errorf("workers: waiting for membership view: %w", ctx.Err())
	}
}

// Ready reports whether the initial entries have been loaded.
func (m *Membership) Ready() bool {
	select {
	case <-m.ready:
		return true
	default:
		return false
	}
}

// Workers returns the known workers (ready or draining), sorted by id.
func (m *Membership) Workers() []Info {
	m.mu.RLock()
	out := make([]Info, 0, len(m.members))
	for _, mb := range m.members {
		out = append(out, mb.info.Clone())
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Get returns a worker's info.
func (m *Membership) Get(id string) (Info, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mb := m.members[KeyFor(id)]
	if mb == nil {
		return Info{}, false
	}
	return mb.info.Clone(), true
}

// Live reports whether the worker is known and has not departed. A
// draining worker is live: its cache and session bindings remain valid.
func (m *Membership) Live(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.members[KeyFor(id)] != nil
}

// Available reports whether the worker is live and takes new requests
// (state ready).
func (m *Membership) Available(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mb := m.members[KeyFor(id)]
	return mb != nil && mb.info.Available()
}

// Epoch returns the current incarnation of a live worker.
func (m *Membership) Epoch(id string) (uint64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mb := m.members[KeyFor(id)]
	if mb == nil {
		return 0, false
	}
	return mb.info.Epoch, true
}

// Len returns the number of live workers.
func (m *Membership) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.members)
}

// Stats returns the view's counters.
func (m *Membership) Stats() MembershipStats {
	return MembershipStats{
		Joins: m.joins.Load(), Updates: m.updates.Load(), Departs: m.departs.Load(),
		Restarts: m.restarts.Load(), Malformed: m.malformed.Load(), Filtered: m.filtered.Load(),
	}
}

// Done is closed when the view has stopped following the registry (Stop,
// or the connection closed).
func (m *Membership) Done() <-chan struct{} { return m.done }

// Stop ends the watch and waits for the view's goroutine to exit. The view
// keeps answering from its last state. Idempotent.
func (m *Membership) Stop() {
	m.stopOnce.Do(func() { close(m.stop) })
	<-m.done
}
