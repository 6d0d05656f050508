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
	// capacity...), or came back from suspect (its key reappeared within
	// DepartureGrace: the info may be unchanged). Heartbeats that rewrite
	// the same value call nothing.
	OnUpdate func(Info)
	// OnSuspect: the incarnation's key vanished without a deregistration
	// (it expired, or was purged): it may be a registry failover that the
	// worker outlives, so the departure is not confirmed yet. Stop choosing
	// the worker (Available is false) but keep its cache and bindings (Live
	// stays true). Either OnUpdate (it came back within DepartureGrace) or
	// OnDepart (it did not) follows.
	OnSuspect func(Info)
	// OnDepart: the departure of the incarnation is confirmed: its key was
	// deleted by Deregister (or a KV delete), or vanished and did not come
	// back within DepartureGrace, or its drain deadline passed, or a new
	// epoch replaced it. Drop everything held for it.
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
	// Mismatched counts entries ignored because the worker id in the value
	// does not name the key they were written under (one worker writing
	// another's key, or a forged one); not counted in Malformed.
	Mismatched uint64
	Filtered   uint64 // valid entries of another model, ignored
	// Suspected counts keys that vanished without a deregistration;
	// Returned those that came back within DepartureGrace (the others are
	// in Departs, with DrainExpired the drains that hit their deadline).
	Suspected, Returned, DrainExpired uint64
	// Suspect is the number of workers suspect right now.
	Suspect int
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

	grace time.Duration // DepartureGrace with its default applied

	mu      sync.RWMutex
	members map[string]*member // by registry key; also suspect and ended ones
	bad     map[string]bool    // keys whose latest value was malformed (log once)
	// ended counts members whose departure is confirmed while their key
	// still exists (drain deadline passed).
	ended int

	ready     chan struct{}
	readyOnce sync.Once
	done      chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once

	joins, updates, departs, restarts, malformed, mismatched, filtered atomic.Uint64
	suspected, returned, drainExpired                                  atomic.Uint64
}

type member struct {
	info Info
	raw  []byte // last value, to skip decoding identical heartbeats
	rev  uint64
	// suspect is when the key vanished without a deregistration (zero
	// while it exists); the departure is confirmed at suspect+grace.
	suspect time.Time
	// ended: the drain deadline passed and the departure was confirmed
	// while the key still exists. The view then ignores the incarnation
	// until its key goes or a new epoch replaces it.
	ended bool
}

// due is when m's departure is confirmed unless something changes: grace
// after it became suspect, or its drain deadline, whichever comes first;
// zero when nothing is pending.
func (mb *member) due(grace time.Duration) time.Time {
	if mb.ended {
		return time.Time{}
	}
	var d time.Time
	if !mb.suspect.IsZero() {
		d = mb.suspect.Add(grace)
	}
	if dl := mb.info.DrainDeadline; mb.info.State == StateDraining && !dl.IsZero() && (d.IsZero() || dl.Before(d)) {
		d = dl
	}
	return d
}

// live: the view holds the incarnation and its departure is not confirmed.
func (mb *member) live() bool { return mb != nil && !mb.ended }

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
		grace:   cfg.departureGrace(),
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
	// timer fires at the earliest due time (see member.due): the view's
	// one goroutine confirms those departures, so callbacks stay serial.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
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
			if m.apply(e) {
				m.rearm(timer)
			}
		case <-timer.C:
			m.confirmDue(time.Now())
			m.rearm(timer)
		}
	}
}

// rearm sets timer to the earliest due time of any member (or stops it).
func (m *Membership) rearm(timer *time.Timer) {
	m.mu.RLock()
	var next time.Time
	for _, mb := range m.members {
		if d := mb.due(m.grace); !d.IsZero() && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	m.mu.RUnlock()
	timer.Stop()
	if !next.IsZero() {
		timer.Reset(time.Until(next))
	}
}

// confirmDue confirms the departures that are due at now: suspects whose
// grace ran out (their entry goes) and drains whose deadline passed (the
// entry stays, ended, while the key exists).
func (m *Membership) confirmDue(now time.Time) {
	type departure struct {
		info   Info
		reason string
	}
	var gone []departure
	m.mu.Lock()
	for key, mb := range m.members {
		d := mb.due(m.grace)
		if d.IsZero() || now.Before(d) {
			continue
		}
		switch {
		case !mb.suspect.IsZero() && d.Equal(mb.suspect.Add(m.grace)):
			delete(m.members, key)
			gone = append(gone, departure{mb.info, fmt.Sprintf("registry key gone for %v without coming back", m.grace)})
		case !mb.suspect.IsZero():
			delete(m.members, key)
			m.drainExpired.Add(1)
			gone = append(gone, departure{mb.info, "drain deadline passed (key gone)"})
		default:
			mb.ended = true
			m.ended++
			m.drainExpired.Add(1)
			gone = append(gone, departure{mb.info, "drain deadline " + mb.info.DrainDeadline.Format(time.RFC3339Nano) + " passed"})
		}
	}
	m.mu.Unlock()
	slices.SortFunc(gone, func(a, b departure) int { return strings.Compare(a.info.ID, b.info.ID) })
	for _, g := range gone {
		m.departs.Add(1)
		m.log.Info("worker departed", "worker", g.info.ID, "epoch", g.info.Epoch, "reason", g.reason)
		call(m.cfg.OnDepart, g.info)
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

// apply folds one watch entry into the view and calls the callbacks. It
// reports whether the entry may have changed a due time (a heartbeat that
// rewrites the same value does not), so that run rearms its timer only
// then.
func (m *Membership) apply(e jetstream.KeyValueEntry) bool {
	if e == nil { // end of the initial snapshot
		m.readyOnce.Do(func() { close(m.ready) })
		return false
	}
	key := e.Key()
	m.mu.Lock()
	prev := m.members[key]
	if e.Operation() != jetstream.KeyValuePut {
		delete(m.bad, key)
		return m.vanishedAndUnlock(key, prev, e)
	}
	if prev != nil && prev.suspect.IsZero() && bytes.Equal(prev.raw, e.Value()) {
		// a heartbeat (also of an ended incarnation, which stays ended)
		prev.rev = e.Revision()
		m.mu.Unlock()
		return false
	}
	info, mismatch, err := decodeEntry(key, e.Value())
	if err != nil {
		m.ignoreAndUnlock(key, info, e.Revision(), mismatch, err)
		return false
	}
	delete(m.bad, key)
	if m.rc.Model != "" && info.Model != m.rc.Model {
		m.filtered.Add(1)
		if prev == nil {
			m.mu.Unlock()
			return false
		}
		// It moved to another model: gone from this view.
		m.departAndUnlock(key, prev, "moved to model "+strconv.Quote(info.Model))
		return true
	}
	cur := &member{info: info, raw: bytes.Clone(e.Value()), rev: e.Revision()}
	if prev != nil && prev.ended {
		return m.afterEndedAndUnlock(key, prev, cur)
	}
	m.members[key] = cur
	m.mu.Unlock()
	m.announce(prev, info)
	return true
}

// decodeEntry decodes a registry value stored under key. An info whose id
// does not escape to key is an error too (mismatch), so that one worker
// can never appear under two keys.
func decodeEntry(key string, value []byte) (info Info, mismatch bool, err error) {
	info, err = DecodeInfo(value)
	if err == nil && KeyFor(info.ID) != key {
		return info, true, &InfoError{ID: info.ID, Field: "id", Reason: fmt.Sprintf("stored under key %q, want %q", key, KeyFor(info.ID))}
	}
	return info, false, err
}

// ignoreAndUnlock counts an entry that decodeEntry refused and releases
// m.mu (held by the caller). The entry is ignored and the view keeps what
// it had: the key still exists, so a known worker stays known until its
// key goes. One log line per episode: until the key holds a good value
// again.
func (m *Membership) ignoreAndUnlock(key string, info Info, rev uint64, mismatch bool, err error) {
	if mismatch {
		m.mismatched.Add(1)
	} else {
		m.malformed.Add(1)
	}
	first := !m.bad[key]
	m.bad[key] = true
	m.mu.Unlock()
	switch {
	case first && mismatch:
		m.log.Warn("ignoring registry entry whose worker id does not match its key (further ones are only counted)",
			"key", key, "worker", info.ID, "revision", rev, "err", err)
	case first:
		m.log.Warn("ignoring malformed registry entry", "key", key, "revision", rev, "err", err)
	}
}

// afterEndedAndUnlock applies cur, a good value of the same model, over
// prev, an incarnation whose departure was confirmed at its drain
// deadline, and releases m.mu (held by the caller): a rewrite by the same
// epoch stays departed, a new epoch is a restart and joins.
func (m *Membership) afterEndedAndUnlock(key string, prev, cur *member) bool {
	if prev.info.Epoch == cur.info.Epoch {
		// A drained-out incarnation rewrote its value: its departure
		// stays confirmed.
		prev.raw, prev.rev = cur.raw, cur.rev
		m.mu.Unlock()
		return false
	}
	m.ended--
	m.members[key] = cur
	m.mu.Unlock()
	m.restarts.Add(1)
	m.joins.Add(1)
	m.log.Info("worker restarted after its drain deadline", "worker", cur.info.ID, "old_epoch", prev.info.Epoch, "epoch", cur.info.Epoch)
	call(m.cfg.OnJoin, cur.info)
	return true
}

// announce counts, logs and calls back what replacing prev (nil for a
// new worker) by info means: a join, a restart (new epoch: the cache is
// lost), a return within the departure grace, or an update; an info equal
// to that of a prev that is not suspect calls nothing.
func (m *Membership) announce(prev *member, info Info) {
	switch {
	case prev == nil:
		m.joins.Add(1)
		m.log.Info("worker joined", "worker", info.ID, "epoch", info.Epoch, "model", info.Model, "state", info.State)
		call(m.cfg.OnJoin, info)
	case prev.info.Epoch != info.Epoch:
		// A new epoch lost its cache: a restart, within the grace or not.
		m.restarts.Add(1)
		m.departs.Add(1)
		m.joins.Add(1)
		m.log.Info("worker restarted", "worker", info.ID, "old_epoch", prev.info.Epoch, "epoch", info.Epoch)
		call(m.cfg.OnDepart, prev.info)
		call(m.cfg.OnJoin, info)
	case !prev.suspect.IsZero():
		m.returned.Add(1)
		m.log.Info("worker's registry key came back within the departure grace: not departed", "worker", info.ID,
			"epoch", info.Epoch, "gone_for", time.Since(prev.suspect).Round(time.Millisecond))
		call(m.cfg.OnUpdate, info)
	case !prev.info.Equal(info):
		m.updates.Add(1)
		if prev.info.State != info.State {
			m.log.Info("worker state changed", "worker", info.ID, "from", prev.info.State, "to", info.State)
		}
		call(m.cfg.OnUpdate, info)
	}
}

// vanishedAndUnlock handles a delete, purge or expiry marker for key
// (prev is its member, or nil), releasing m.mu (held by the caller). A KV
// delete and Deregister's purge (it carries deregisterNote: the server's
// expiry marker has no body) are explicit departures, confirmed at once;
// an expiry or a bare purge makes the worker suspect until DepartureGrace
// passes.
func (m *Membership) vanishedAndUnlock(key string, prev *member, e jetstream.KeyValueEntry) bool {
	switch {
	case prev == nil || !prev.suspect.IsZero():
		m.mu.Unlock() // unknown, or already suspect
		return false
	case prev.ended:
		delete(m.members, key) // its departure was confirmed at the drain deadline
		m.ended--
		m.mu.Unlock()
		return true
	}
	explicit := e.Operation() == jetstream.KeyValueDelete || len(e.Value()) > 0
	if explicit || m.grace == 0 {
		reason := "deleted"
		switch {
		case e.Operation() == jetstream.KeyValueDelete:
		case len(e.Value()) > 0:
			reason = "deregistered"
		default:
			reason = "expired or purged (no departure grace)"
		}
		m.departAndUnlock(key, prev, reason)
		return true
	}
	prev.suspect = time.Now()
	m.mu.Unlock()
	m.suspected.Add(1)
	m.log.Warn("worker suspect: its registry key expired or was purged; departure confirmed unless it comes back",
		"worker", prev.info.ID, "epoch", prev.info.Epoch, "grace", m.grace)
	call(m.cfg.OnSuspect, prev.info)
	return true
}

// departAndUnlock removes key's member prev from the view, releases m.mu
// (held by the caller), and then counts, logs and reports the departure, so
// that OnDepart runs without the lock like every callback.
func (m *Membership) departAndUnlock(key string, prev *member, reason string) {
	delete(m.members, key)
	if prev.ended {
		m.ended--
		m.mu.Unlock()
		return // reported at its drain deadline
	}
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

// Workers returns the live workers (ready, draining, unavailable or
// suspect), sorted by id.
func (m *Membership) Workers() []Info {
	m.mu.RLock()
	out := make([]Info, 0, len(m.members))
	for _, mb := range m.members {
		if mb.live() {
			out = append(out, mb.info.Clone())
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Get returns a live worker's info (also while it is suspect).
func (m *Membership) Get(id string) (Info, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mb := m.members[KeyFor(id)]
	if !mb.live() {
		return Info{}, false
	}
	return mb.info.Clone(), true
}

// Live reports whether the worker is known and its departure is not
// confirmed. A draining worker is live (its cache and session bindings
// remain valid) until it deregisters or its drain deadline passes; a
// suspect worker (key vanished, see Suspect) is live until DepartureGrace
// passes. Bindings use this: a Hard binding moves only once it is false.
func (m *Membership) Live(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.members[KeyFor(id)].live()
}

// Suspect reports whether the worker's key vanished without a
// deregistration and the view is waiting, at most DepartureGrace, for it
// to come back: live, but not available.
func (m *Membership) Suspect(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mb := m.members[KeyFor(id)]
	return mb.live() && !mb.suspect.IsZero()
}

// Available reports whether the worker is live, not suspect, and takes new
// requests (state ready).
func (m *Membership) Available(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mb := m.members[KeyFor(id)]
	return mb.live() && mb.suspect.IsZero() && mb.info.Available()
}

// Epoch returns the current incarnation of a live worker.
func (m *Membership) Epoch(id string) (uint64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mb := m.members[KeyFor(id)]
	if !mb.live() {
		return 0, false
	}
	return mb.info.Epoch, true
}

// Len returns the number of live workers.
func (m *Membership) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.members) - m.ended
}

// Stats returns the view's counters.
func (m *Membership) Stats() MembershipStats {
	m.mu.RLock()
	suspect := 0
	for _, mb := range m.members {
		if mb.live() && !mb.suspect.IsZero() {
			suspect++
		}
	}
	m.mu.RUnlock()
	return MembershipStats{
		Joins: m.joins.Load(), Updates: m.updates.Load(), Departs: m.departs.Load(),
		Restarts: m.restarts.Load(), Malformed: m.malformed.Load(), Mismatched: m.mismatched.Load(),
		Filtered: m.filtered.Load(), Suspected: m.suspected.Load(), Returned: m.returned.Load(),
		DrainExpired: m.drainExpired.Load(), Suspect: suspect,
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
