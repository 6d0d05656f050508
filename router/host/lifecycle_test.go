package host

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/nats-io/nats.go"
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
	first.writeSnapshots()
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

// Close stops taking requests (readiness goes, the queue group is left),
// lets in-flight work finish, and leaves no goroutine behind.
func TestGracefulShutdown(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	ctx := ctxT(t)
	r := st.replicas[0]
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	if code, _ := httpDo(t, "GET", srv.URL+"/readyz", nil); code != 200 {
		t.Fatalf("readyz before close: %d", code)
	}
	resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64), SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	// Requests in flight while Close runs still get an answer.
	done := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func(i int) {
			_, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(10+i, 64)})
			done <- err
		}(i)
	}
	time.Sleep(5 * time.Millisecond)
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		if err := <-done; err != nil && !errors.Is(err, api.ErrNoRouter) && !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("in-flight request: %v", err)
		}
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
	_ = resp
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
	_ = kvevents.DefaultPrefix
}

func TestInflightGate(t *testing.T) {
	var g inflightGate
	if !g.enter() || !g.enter() {
		t.Fatal("enter refused on an open gate")
	}
	done := make(chan struct{})
	go func() { g.wait(); close(done) }()
	time.Sleep(10 * time.Millisecond)
	if !g.enter() { // a call racing wait while others are in flight is admitted and waited for
		t.Fatal("enter refused while calls are in flight")
	}
	g.leave()
	g.leave()
	select {
	case <-done:
		t.Fatal("wait returned with a call in flight")
	case <-time.After(10 * time.Millisecond):
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
