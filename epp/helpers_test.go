package epp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoredGoroutines()...)
}

const testModel = "m"

func testLogger() *slog.Logger {
	if os.Getenv("KVR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// testRegistry: TTLs long enough that 1,000 streams under the race
// detector on two cores do not starve a heartbeat (no test here kills an
// engine; one deregisters).
func testRegistry() workers.RegistryConfig {
	return workers.RegistryConfig{TTL: 10 * time.Second, Heartbeat: time.Second, MarkerTTL: time.Second, Logger: testLogger()}
}

// fleet is an embedded NATS server, one router replica, simulated engines
// behind their vLLM HTTP face (each registered with its base URL, so its
// ip:port is what the proxy dials), a gateway over the replica and the
// endpoint picker on a loopback gRPC server, with a client as Envoy's.
type fleet struct {
	t       testing.TB
	replica *host.Replica
	engines []*testEngine
	g       *gateway.Gateway
	epp     *Server
	client  extprocv3.ExternalProcessorClient
	conn    *grpc.ClientConn
	http    *http.Client // the proxy's upstream client
}

type testEngine struct {
	id   string
	addr string // ip:port, as the proxy dials it
	eng  *sim.Engine
	reg  *workers.Registration
}

// startFleet starts n engines; mutate adjusts the picker's Config.
func startFleet(t testing.TB, n int, mutate func(*Config)) *fleet {
	t.Helper()
	srv := natstest.Start(t, natstest.WithMaxPayload(8<<20))
	_, js := natstest.JetStream(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &fleet{t: t, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	r, err := host.New(natstest.Connect(t, srv), host.Config{ReplicaID: "rep-0", Models: []string{testModel}, Registry: testRegistry(),
		Bindings: bindings.Config{IdleTTL: 10 * time.Second, MarkerTTL: time.Second}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.replica = r
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(cctx); err != nil {
			t.Errorf("replica close: %v", err)
		}
	})
	for i := range n {
		f.addEngine(ctx, js, fmt.Sprintf("e%d", i))
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		w, _ := r.Workers(testModel)
		return len(w.Workers) == n
	}, func() string { return fmt.Sprintf("the replica does not see %d workers", n) })

	if f.g, err = gateway.New(gateway.Config{Router: gateway.ReplicaRouter{R: r}, Models: []string{testModel},
		WorkersTTL: 100 * time.Millisecond, Logger: testLogger()}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Gateway: f.g, Ready: r.IsReady, Logger: testLogger()}
	if mutate != nil {
		mutate(&cfg)
	}
	if f.epp, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	f.serve()
	return f
}

// serve runs the picker on a loopback gRPC server and connects to it.
func (f *fleet) serve() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	gs := grpc.NewServer()
	f.epp.Register(gs)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(ln) }()
	if f.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		f.t.Fatal(err)
	}
	f.client = extprocv3.NewExternalProcessorClient(f.conn)
	f.t.Cleanup(func() {
		f.conn.Close()
		gs.Stop()
		<-done
		f.http.CloseIdleConnections()
	})
}

// addEngine starts a simulated engine publishing its KV events, with its
// HTTP face, registered with its base URL as the endpoint.
func (f *fleet) addEngine(ctx context.Context, js jetstream.JetStream, id string) {
	f.t.Helper()
	mk := sim.PublisherFactory(js, kvevents.PublisherConfig{Model: testModel, MaxDelay: time.Millisecond})
	eng, err := sim.New(sim.Config{Worker: id, Model: testModel, KVBlocks: 4096, Speedup: 200,
		NewEmitter: func(rank uint32, epoch uint64) (sim.EventEmitter, error) { return mk(id, rank, epoch) }})
	if err != nil {
		f.t.Fatal(err)
	}
	face, err := vllmapi.New(vllmapi.Config{Engine: eng, MaxModelLen: 8192, Logger: testLogger()})
	if err != nil {
		f.t.Fatal(err)
	}
	hs := httptest.NewServer(face)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = eng.Run(runCtx) }()
	info := eng.Info()
	info.Endpoint = hs.URL + "/v1"
	reg, err := workers.Register(ctx, js, testRegistry(), info)
	if err != nil {
		f.t.Fatal(err)
	}
	f.engines = append(f.engines, &testEngine{id: id, addr: strings.TrimPrefix(hs.URL, "http://"), eng: eng, reg: reg})
	f.t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = reg.Deregister(cctx)
		_ = eng.Close(cctx)
		stop()
		<-done
	})
}

// engineAt is the engine listening on addr.
func (f *fleet) engineAt(addr string) *testEngine {
	for _, e := range f.engines {
		if e.addr == addr {
			return e
		}
	}
	return nil
}

// waitIdle waits until the replica holds no booking.
func (f *fleet) waitIdle() {
	f.t.Helper()
	testutil.Eventually(f.t, 15*time.Second, func() bool { return f.active() == 0 },
		func() string { return fmt.Sprintf("bookings are not back to zero: %d active", f.active()) })
}

// active is the number of requests the replica has booked on any worker.
func (f *fleet) active() int {
	w, _ := f.replica.Workers(testModel)
	n := 0
	for _, ws := range w.Workers {
		if ws.Load != nil {
			n += ws.Load.ActiveRequests
		}
	}
	return n
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// longText is a prompt of n bytes (the simulator's tokenizer is
// byte-level: n tokens).
func longText(seed string, n int) string {
	return strings.Repeat(seed+" ", n/(len(seed)+1)+1)[:n]
}
