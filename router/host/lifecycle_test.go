package host

import (
	"context"
	"errors"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"go.yaml.in/yaml/v3"
)

// A replica that starts after a snapshot loads it and replays only the
// events after it, ending with the same index as one that read the whole
// stream.
func TestSnapshotRestoreOnNewReplica(t *testing.T) {
	st := startStack(t, stackOpts{workers: 2, replicas: 1})
	st.waitWorkers(2)
	ctx := ctxT(t)
	for i := 0; i < 3; i++ {
		toks := tokens(700+i, 256)
		resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: toks})
		if err != nil {
			t.Fatal(err)
		}
		st.generate(ctx, resp, toks)
	}
	first := st.replicas[0]
	testutil.Eventually(t, 10*time.Second, func() bool { return first.models[testModel].index.Stats().Entries >= 48 },
		func() string { return "events not indexed" })
	first.intake.writeSnapshots()
	snapSeq := first.models[testModel].index.StreamSeq()
	// More events after the snapshot.
	toks := tokens(800, 256)
	resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: toks})
	if err != nil {
		t.Fatal(err)
	}
	st.generate(ctx, resp, toks)
	testutil.Eventually(t, 10*time.Second, func() bool { return first.models[testModel].index.Stats().Entries >= 64 },
		func() string { return "later events not indexed" })

	nc := natstest.Connect(t, st.srv)
	r2, err := New(nc, Config{ReplicaID: "late", Models: []string{testModel}, Registry: testRegistry(), LoadSnapshot: true,
		Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Close(context.Background()) })
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r2.models[testModel].index.StreamSeq(); got < snapSeq {
		t.Fatalf("new replica at stream seq %d, snapshot was at %d", got, snapSeq)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		return dumpEqual(first.models[testModel].index.Dump(), r2.models[testModel].index.Dump())
	}, func() string { return "restored index differs from the original" })
}

func dumpEqual(a, b []index.WorkerDump) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || len(a[i].Blocks) != len(b[i].Blocks) {
			return false
		}
		for j := range a[i].Blocks {
			if a[i].Blocks[j] != b[i].Blocks[j] {
				return false
			}
		}
	}
	return true
}

// gatePolicy selects the first candidate, blocking while armed until
// released: it holds route requests in flight for as long as a test needs.
type gatePolicy struct {
	armed   *atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (gatePolicy) Name() string { return "gate" }

func (g gatePolicy) Select(*scheduler.Context, *scheduler.Candidates) (int, error) {
	if g.armed.Load() {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		<-g.release
	}
	return 0, nil
}

// Close stops taking requests (readiness goes, the queue group is left),
// lets in-flight work finish, and leaves no goroutine behind.
func TestGracefulShutdown(t *testing.T) {
	gate := gatePolicy{armed: new(atomic.Bool), entered: make(chan struct{}, 1), release: make(chan struct{})}
	reg := scheduler.NewRegistry()
	if err := reg.RegisterPolicy("gate", func(*scheduler.Registry, *yaml.Node) (scheduler.Policy, error) { return gate, nil }); err != nil {
		t.Fatal(err)
	}
	st := startStack(t, stackOpts{workers: 1, replicas: 1, mutate: func(_ int, c *Config) {
		c.Policy, c.PolicyRegistry = scheduler.PolicyConfig{Name: "gate"}, reg
	}})
	st.waitWorkers(1)
	ctx := ctxT(t)
	r := st.replicas[0]
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	if code, _ := httpDo(t, "GET", srv.URL+"/readyz", nil); code != 200 {
		t.Fatalf("readyz before close: %d", code)
	}
	if _, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64), SessionID: "s"}); err != nil {
		t.Fatal(err)
	}

	// Hold 8 requests in flight: the first blocks in the policy, the others
	// wait for the scheduler behind it.
	gate.armed.Store(true)
	const n = 8
	done := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			_, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(10+i, 64)})
			done <- err
		}(i)
	}
	<-gate.entered
	testutil.Eventually(t, 10*time.Second, func() bool { return r.inflight.count() == n },
		func() string { return "requests in flight: " + strconv.Itoa(r.inflight.count()) })

	// Close while they are held; they are released once Close waits for them.
	closed := make(chan error, 1)
	go func() { closed <- r.Close(ctx) }()
	testutil.Eventually(t, 10*time.Second, r.inflight.waiting, func() string { return "Close does not wait for the requests in flight" })
	select {
	case err := <-closed:
		t.Fatalf("Close returned with requests in flight: %v", err)
	default:
	}
	close(gate.release)
	for i := 0; i < n; i++ {
		if err := <-done; err != nil {
			t.Errorf("request in flight during Close: %v", err)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}

	if code, _ := httpDo(t, "GET", srv.URL+"/readyz", nil); code != 503 {
		t.Fatalf("readyz after close: %d", code)
	}
	if _, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64)}); !errors.Is(err, api.ErrNoRouter) {
		t.Fatalf("route after close: %v (want no responders)", err)
	}
	var out api.RouteResponse
	if err := r.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64)}, &out); !errors.Is(err, api.ErrShuttingDown) {
		t.Fatalf("in-process route after close: %v", err)
	}
}

// A replica that has not caught up answers not_ready and is not ready.
func TestNotReadyBeforeStart(t *testing.T) {
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	r, err := New(nc, Config{Models: []string{testModel}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	if code, _ := httpDo(t, "GET", srv.URL+"/readyz", nil); code != 503 {
		t.Fatalf("readyz: %d", code)
	}
	code, b := httpDo(t, "POST", srv.URL+"/v1/route", []byte(`{"model":"m","token_ids":[1]}`))
	if e := api.DecodeError(b); code != 503 || e == nil || e.Code != api.CodeNotReady {
		t.Fatalf("route before start: %d %s", code, b)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrors(t *testing.T) {
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	for _, c := range []Config{
		{},
		{Models: []string{""}},
		{Models: []string{"a", "a"}},
		{Models: []string{"a"}, BlockSize: -1},
		{Models: []string{"a"}, SnapshotInterval: -time.Second},
	} {
		if _, err := New(nc, c); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", c, err)
		}
	}
}

func TestInflightGate(t *testing.T) {
	var g inflightGate
	if !g.enter() || !g.enter() { // two calls enter, the gate counts both
		t.Fatal("enter refused on an open gate")
	}
	done := make(chan struct{})
	go func() { g.wait(); close(done) }()
	testutil.Eventually(t, 5*time.Second, g.waiting, func() string { return "wait did not start waiting" })
	if !g.enter() { // a call racing wait while others are in flight is admitted and waited for
		t.Fatal("enter refused while calls are in flight")
	}
	g.leave()
	g.leave()
	select {
	case <-done:
		t.Fatal("wait returned with a call in flight")
	default: // leave is synchronous: only the last one can end wait
	}
	g.leave()
	<-done
	if g.enter() {
		t.Fatal("enter admitted after wait returned")
	}
	var idle inflightGate
	idle.wait()
	if idle.enter() {
		t.Fatal("enter admitted after wait on an idle gate")
	}
}

// waiting reports whether wait is waiting for calls in progress.
func (g *inflightGate) waiting() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.zero != nil
}

// count is the number of calls in progress.
func (g *inflightGate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}
