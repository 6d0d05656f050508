package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"
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

// testRegistry: short TTLs so that a killed engine departs within seconds.
func testRegistry() workers.RegistryConfig {
	return workers.RegistryConfig{TTL: time.Second, Heartbeat: 300 * time.Millisecond, MarkerTTL: time.Second, Logger: testLogger()}
}

// fleet is an embedded NATS server, router replicas, vLLM-faced simulated
// engines (joined by registering them directly, their KV events published
// by the engine's emitter) and gateways, in one process.
type fleet struct {
	t        testing.TB
	srv      *server.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	replicas []*host.Replica
	engines  []*testEngine
	gateways []*httptest.Server
}

// testEngine is one simulated engine behind its HTTP face.
type testEngine struct {
	id   string
	eng  *sim.Engine
	http *httptest.Server
	reg  *workers.Registration
	stop context.CancelFunc
	done chan struct{}
	// tokenizeCalls counts the tokenizer requests (/tokenize and the
	// render endpoints) that reached the engine; renderCalls the render
	// ones alone.
	tokenizeCalls, renderCalls atomic.Int64
}

type fleetOpts struct {
	replicas int
	engines  int
	mode     session.Mode // the replicas' default session mode (Hard when unset)
	// approximate runs the replicas in approximate mode and the engines
	// without KV events.
	approximate bool
}

func startFleet(t testing.TB, o fleetOpts) *fleet {
	t.Helper()
	f := &fleet{t: t, srv: natstest.Start(t, natstest.WithMaxPayload(8<<20))}
	f.nc, f.js = natstest.JetStream(t, f.srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range o.replicas {
		cfg := host.Config{ReplicaID: fmt.Sprintf("rep-%d", i), Models: []string{testModel}, Registry: testRegistry(),
			Bindings: bindings.Config{IdleTTL: 10 * time.Second, MarkerTTL: time.Second, DefaultMode: o.mode}, Logger: testLogger(),
			Approximate: o.approximate}
		r, err := host.New(natstest.Connect(t, f.srv), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		f.replicas = append(f.replicas, r)
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := r.Close(cctx); err != nil {
				t.Errorf("replica close: %v", err)
			}
		})
	}
	for i := range o.engines {
		f.addEngine(ctx, fmt.Sprintf("e%d", i), !o.approximate)
	}
	f.waitWorkers(o.engines)
	return f
}

// addEngine starts a simulated engine with its HTTP face and registers it
// with its base URL as the endpoint; with events, its KV events are
// published (otherwise it says nothing, as an engine for approximate mode).
func (f *fleet) addEngine(ctx context.Context, id string, events bool) *testEngine {
	f.t.Helper()
	cfg := sim.Config{Worker: id, Model: testModel, KVBlocks: 4096, Speedup: 200}
	if events {
		mk := sim.PublisherFactory(f.js, kvevents.PublisherConfig{Model: testModel, MaxDelay: time.Millisecond})
		cfg.NewEmitter = func(rank uint32, epoch uint64) (sim.EventEmitter, error) { return mk(id, rank, epoch) }
	}
	eng, err := sim.New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	api, err := vllmapi.New(vllmapi.Config{Engine: eng, MaxModelLen: 4096, Logger: testLogger()})
	if err != nil {
		f.t.Fatal(err)
	}
	te := &testEngine{id: id, eng: eng, done: make(chan struct{})}
	te.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" || strings.HasSuffix(r.URL.Path, "/render") {
			te.tokenizeCalls.Add(1)
		}
		if strings.HasSuffix(r.URL.Path, "/render") {
			te.renderCalls.Add(1)
		}
		api.ServeHTTP(w, r)
	}))
	runCtx, stop := context.WithCancel(context.Background())
	te.stop = stop
	go func() { defer close(te.done); _ = eng.Run(runCtx) }()
	info := eng.Info()
	info.Endpoint = te.http.URL + "/v1"
	if te.reg, err = workers.Register(ctx, f.js, testRegistry(), info); err != nil {
		f.t.Fatal(err)
	}
	f.engines = append(f.engines, te)
	f.t.Cleanup(te.close)
	return te
}

// kill stops the engine at once: its connections break, it leaves the
// registry (its key is deleted, as after a missed TTL).
func (te *testEngine) kill() {
	te.http.CloseClientConnections()
	te.close()
}

func (te *testEngine) close() {
	te.http.CloseClientConnections()
	te.http.Close()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = te.reg.Deregister(cctx)
	_ = te.eng.Close(cctx)
	te.stop()
	<-te.done
}

// waitWorkers waits until every replica knows n workers.
func (f *fleet) waitWorkers(n int) {
	f.t.Helper()
	testutil.Eventually(f.t, 10*time.Second, func() bool {
		for _, r := range f.replicas {
			w, _ := r.Workers(testModel)
			if len(w.Workers) != n {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("replicas do not all see %d workers", n) })
}

// waitIdle waits until no replica holds a booking on any worker.
func (f *fleet) waitIdle() {
	f.t.Helper()
	testutil.Eventually(f.t, 10*time.Second, func() bool {
		for _, r := range f.replicas {
			w, _ := r.Workers(testModel)
			for _, ws := range w.Workers {
				if ws.Load != nil && ws.Load.ActiveRequests != 0 {
					return false
				}
			}
		}
		return true
	}, func() string { return "bookings are not back to zero: " + f.loads() })
}

func (f *fleet) loads() string {
	s := ""
	for _, r := range f.replicas {
		w, _ := r.Workers(testModel)
		for _, ws := range w.Workers {
			if ws.Load != nil {
				s += fmt.Sprintf("%s@%s=%d ", ws.Worker, w.Replica, ws.Load.ActiveRequests)
			}
		}
	}
	return s
}

// gateway starts a gateway over router (nil: the first replica in
// process) and returns its base URL.
func (f *fleet) gateway(router Router, mutate func(*Config)) string {
	f.t.Helper()
	if router == nil {
		router = ReplicaRouter{R: f.replicas[0]}
	}
	cfg := Config{Router: router, Models: []string{testModel}, WorkersTTL: 100 * time.Millisecond, Logger: testLogger()}
	if mutate != nil {
		mutate(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	s := labelledServer("gateway", g)
	f.t.Cleanup(func() {
		s.CloseClientConnections()
		s.Close()
		g.http.CloseIdleConnections()
	})
	f.gateways = append(f.gateways, s)
	return s.URL
}

// natsRouter is the route API over a new NATS connection.
func (f *fleet) natsRouter() Router {
	return ClientRouter{C: api.NewClient(natstest.Connect(f.t, f.srv), "", nil)}
}

// client is the official OpenAI client pointed at a gateway.
func client(base string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1/"), option.WithAPIKey("test"),
		option.WithMaxRetries(0), option.WithHTTPClient(&http.Client{Transport: &http.Transport{}})}, opts...)...)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// refusingEndpoint is a base URL where nothing listens.
func refusingEndpoint(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/v1"
}
