package workers

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoreNATSAsyncReply())
}

// Short timings keep the suite fast: 1 s is the smallest per-key TTL.
const (
	testTTL       = time.Second
	testHeartbeat = 300 * time.Millisecond
	// slack covers the server's expiry timer and watcher delivery.
	slack = 750 * time.Millisecond
)

// testCfg has no departure grace: an expired key departs at once, as the
// lease tests expect. grace_test.go tests the grace with graceCfg.
func testCfg() RegistryConfig {
	return RegistryConfig{
		TTL: testTTL, Heartbeat: testHeartbeat, MarkerTTL: time.Second, DepartureGrace: -1,
		Logger: slog.New(slog.DiscardHandler),
	}
}

func setup(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	s := natstest.Start(t)
	return natstest.JetStream(t, s)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// event is one membership callback.
type event struct {
	kind string // join, update, suspect, depart
	info Info
	at   time.Time
}

func (e event) String() string {
	return fmt.Sprintf("%s %s/%d %s", e.kind, e.info.ID, e.info.Epoch, e.info.State)
}

// recorder collects membership callbacks.
type recorder struct {
	mu     sync.Mutex
	events []event
	ch     chan event
}

func newRecorder() *recorder { return &recorder{ch: make(chan event, 1024)} }

func (r *recorder) add(kind string, i Info) {
	e := event{kind: kind, info: i, at: time.Now()}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	r.ch <- e
}

func (r *recorder) callbacks() Callbacks {
	return Callbacks{
		OnJoin:    func(i Info) { r.add("join", i) },
		OnUpdate:  func(i Info) { r.add("update", i) },
		OnSuspect: func(i Info) { r.add("suspect", i) },
		OnDepart:  func(i Info) { r.add("depart", i) },
	}
}

func (r *recorder) all() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

// next returns the next event of kind for id, or false if none arrives
// within d.
func (r *recorder) next(kind, id string, d time.Duration) (event, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case e := <-r.ch:
			if e.kind == kind && e.info.ID == id {
				return e, true
			}
		case <-timer.C:
			return event{}, false
		}
	}
}

// wait returns the next event of kind for id, failing after d.
func (r *recorder) wait(t *testing.T, kind, id string, d time.Duration) event {
	t.Helper()
	e, ok := r.next(kind, id, d)
	if !ok {
		t.Fatalf("no %s of %q within %v; events: %v", kind, id, d, r.all())
	}
	return e
}

// none fails if an event of kind for id arrives within d.
func (r *recorder) none(t *testing.T, kind, id string, d time.Duration) {
	t.Helper()
	if e, ok := r.next(kind, id, d); ok {
		t.Fatalf("unexpected %v; events: %v", e, r.all())
	}
}

func watch(t *testing.T, js jetstream.JetStream, cfg RegistryConfig) (*Membership, *recorder) {
	t.Helper()
	rec := newRecorder()
	m, err := WatchMembership(ctxT(t), js, cfg, rec.callbacks())
	if err != nil {
		t.Fatalf("WatchMembership: %v", err)
	}
	t.Cleanup(m.Stop)
	if err := m.WaitReady(ctxT(t)); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	return m, rec
}

func register(t *testing.T, js jetstream.JetStream, cfg RegistryConfig, info Info) *Registration {
	t.Helper()
	r, err := Register(ctxT(t), js, cfg, info)
	if err != nil {
		t.Fatalf("Register %q: %v", info.ID, err)
	}
	t.Cleanup(r.Stop)
	return r
}

// watchAndRegisterW1 starts a membership view, registers worker w1 and
// waits for the view to see it join.
func watchAndRegisterW1(t *testing.T, js jetstream.JetStream, cfg RegistryConfig) (*Membership, *recorder, *Registration) {
	t.Helper()
	m, rec := watch(t, js, cfg)
	reg := register(t, js, cfg, validInfo("w1"))
	rec.wait(t, "join", "w1", 2*time.Second)
	return m, rec, reg
}
