package bindings

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workerref"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoreNATSAsyncReply(),
		// The embedded servers' own background goroutines can outlive
		// Shutdown by a moment; ours (watch, sweeper) may not.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).acceptConnections"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("time.Sleep"),
	)
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// env is one embedded server and a way to open replicas (Tables) on it, each
// on its own connection as separate router processes would be.
type env struct {
	t testing.TB
	s *server.Server
}

func newEnv(t testing.TB) *env { return &env{t: t, s: natstest.Start(t)} }

func (e *env) open(cfg Config) *Table {
	e.t.Helper()
	nc, js := natstest.JetStream(e.t, e.s)
	return openOn(e.t, js, nc, cfg)
}

func openOn(t testing.TB, js jetstream.JetStream, nc *nats.Conn, cfg Config) *Table {
	t.Helper()
	var log testutil.LogBuffer
	if cfg.Logger == nil {
		// What the table logs while it opens (a watch lost, a quorum
		// mark failed) is the only trace of why an Open timed out.
		cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	}
	tb, err := Open(ctxT(t, 60*time.Second), js, nc, cfg)
	if err != nil {
		t.Fatalf("Open: %v\ntable log:\n%s", err, log.String())
	}
	t.Cleanup(func() { tb.Close() })
	return tb
}

// pick returns a selector that honours a requirement (the pin rule with
// every worker eligible) and otherwise picks at random among workers.
func pick(workers ...string) Selector {
	return func(_ context.Context, req *Requirement) (workerref.Target, error) {
		if req != nil {
			return req.Target, nil
		}
		return workerref.Any(workers[rand.IntN(len(workers))]), nil
	}
}

// always returns a selector that ignores the requirement.
func always(worker string) Selector {
	return func(context.Context, *Requirement) (workerref.Target, error) { return workerref.Any(worker), nil }
}

// liveSet is a Liveness backed by a set the test edits.
type liveSet struct {
	mu   sync.Mutex
	gone map[string]bool
}

func (l *liveSet) Live(w string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.gone[w]
}

func (l *liveSet) depart(w string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone == nil {
		l.gone = map[string]bool{}
	}
	l.gone[w] = true
}

// leaderGet reads a session's binding from the stream leader.
func leaderGet(t testing.TB, tb *Table, model, session string) readState {
	t.Helper()
	key, err := Key(model, session)
	if err != nil {
		t.Fatal(err)
	}
	st, err := tb.leaderRead(ctxT(t, 10*time.Second), key)
	if err != nil {
		t.Fatalf("leader read of %q: %v", key, err)
	}
	return st
}

func mustRoute(t testing.TB, tb *Table, model, session string, sel Selector) Result {
	t.Helper()
	res, err := tb.Route(ctxT(t, 10*time.Second), model, session, sel)
	if err != nil {
		t.Fatalf("Route(%q, %q): %v", model, session, err)
	}
	return res
}
