package realpath

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/bridge"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoredGoroutines()...)
}

const (
	testModel = "m"
	testBlock = 16 // engines' and routers' block size
)

func testLogger() *slog.Logger {
	if os.Getenv("KVR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// testRegistry: short TTLs, so that the stack starts and stops quickly.
func testRegistry() workers.RegistryConfig {
	return workers.RegistryConfig{TTL: time.Second, Heartbeat: 300 * time.Millisecond, MarkerTTL: time.Second, Logger: testLogger()}
}

// conn connects to the stack's server as role (anonymously unless the
// stack has a connect function), with a JetStream handle; it closes when
// the test ends.
func (st *stack) conn(role string) (*nats.Conn, jetstream.JetStream) {
	st.t.Helper()
	if st.o.connect == nil {
		return natstest.JetStream(st.t, st.srv)
	}
	nc := st.o.connect(st.t, role)
	js, err := jetstream.New(nc)
	if err != nil {
		st.t.Fatal(err)
	}
	return nc, js
}

// stack is the whole real path in one process.
type stack struct {
	t        *testing.T
	o        stackOpts
	srv      *server.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	replicas []*host.Replica
	engines  []*engine
	http     *http.Client // the test's own client to the engines
	ranks    int          // of each engine
}

// engine is one `kvrouter sim serve` engine as cmd/kvrouter/sim.go starts
// it: the simulated core, its vLLM event sockets (PUB and replay) and its
// HTTP face on a real listener.
type engine struct {
	id      string
	eng     *sim.Engine
	face    *vllmapi.Server
	events  *sim.VLLMEvents
	srv     *http.Server
	url     string
	stopRun context.CancelFunc
	ran     chan struct{}
	ranks   int
	// tokenizeCalls and renderCalls count the /tokenize and render
	// requests that reached the engine.
	tokenizeCalls, renderCalls atomic.Int64
	// intercept, when set, serves the engine's requests in its place (it
	// may call next, the engine's face): pd_test.go records and fails legs.
	intercept atomic.Pointer[func(w http.ResponseWriter, r *http.Request, next http.Handler)]
	// traceparent is the header of the latest generate request.
	traceparent atomic.Pointer[string]
}

type stackOpts struct {
	engines, replicas int
	kvBlocks          int  // per engine rank
	eventsOnly        bool // replicas without the predicted index: route overlaps read the event-fed index alone
	lateBridges       int  // the last this many engines start without a bridge (the test starts it)
	imageTokens       int  // placeholder tokens per image (0: vllmapi's default)
	maxModelLen       int  // the engines' context length (0: 8192)
	// srv and connect run the stack on an external server with one login
	// per role ("router", "gateway", "worker:<id>"): longprompt_test.go.
	// Default: an embedded server, anonymous connections.
	srv     *server.Server
	connect func(t *testing.T, role string) *nats.Conn
	// face changes the engines' HTTP face (vllmapi.Config) before they
	// start: a BOS token, no render endpoints, ...
	face func(*vllmapi.Config)
	// staleIntervals is the bridges' StaleIntervals (0: the bridge's
	// default): a long test on a loaded machine raises it, so that a late
	// scrape does not make a worker unavailable for a moment.
	staleIntervals int
	// ranks is each engine's data-parallel ranks (0: 1). With more, each
	// rank's event sockets listen on consecutive ports, as vLLM's.
	ranks int
	// roles are the engines' roles in a disaggregated fleet, by engine id,
	// as their bridges register them (absent: both).
	roles map[string]workers.Role
	// tel is the replicas' telemetry (zero: no spans, no metrics).
	tel host.Telemetry
}

func startStack(t *testing.T, o stackOpts) *stack {
	t.Helper()
	st := &stack{t: t, o: o, ranks: max(o.ranks, 1), srv: o.srv, http: &http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Second}}
	if st.srv == nil {
		st.srv = natstest.Start(t, natstest.WithMaxPayload(8<<20))
	}
	t.Cleanup(st.http.CloseIdleConnections)
	st.nc, st.js = st.conn("router")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The event stream, as `kvrouter bridge` ensures it before Run.
	if _, err := kvevents.EnsureStream(ctx, st.js, kvevents.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	for i := range o.replicas {
		st.startReplica(ctx, i, o.eventsOnly)
	}
	for i := range o.engines {
		e := st.startEngine(fmt.Sprintf("e%d", i), o)
		if i < o.engines-o.lateBridges {
			st.startBridge(e, o.staleIntervals)
		}
	}
	st.waitReady(o.engines - o.lateBridges)
	return st
}

func (st *stack) startReplica(ctx context.Context, i int, eventsOnly bool) {
	st.t.Helper()
	cfg := host.Config{ReplicaID: fmt.Sprintf("rep-%d", i), Models: []string{testModel}, Registry: testRegistry(),
		Bindings: bindings.Config{IdleTTL: 10 * time.Second, MarkerTTL: time.Second}, HTTPAddr: "127.0.0.1:0",
		Logger: testLogger().With("replica", i), Telemetry: st.o.tel}
	if eventsOnly {
		cfg.PredictedTTL, cfg.DecisionSyncBuffer = -1, -1
	}
	nc, _ := st.conn("router")
	r, err := host.New(nc, cfg)
	if err != nil {
		st.t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		_ = r.Close(context.Background())
		st.t.Fatalf("replica %d start: %v", i, err)
	}
	st.replicas = append(st.replicas, r)
	st.t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(cctx); err != nil {
			st.t.Errorf("replica %d close: %v", i, err)
		}
	})
}

// startEngine starts an engine with o.kvBlocks and o.ranks, events on
// ephemeral ZMQ ports (consecutive free ones for several ranks) and HTTP
// on 127.0.0.1:0, its HTTP face changed by o.face (nil: as is).
func (st *stack) startEngine(id string, o stackOpts) *engine {
	var fc vllmapi.Config
	if o.face != nil {
		o.face(&fc)
	}
	return st.startEngineWith(id, sim.Config{KVBlocks: o.kvBlocks}, fc)
}

// startEngineWith is startEngine with more of the engine's and its HTTP
// face's settings (id, model, block size, speed-up, ranks, events and the
// listener are the harness's).
func (st *stack) startEngineWith(id string, sc sim.Config, fc vllmapi.Config) *engine {
	st.t.Helper()
	ranks := st.ranks
	ec := vllmzmq.DefaultConfig()
	ec.EnableKVCacheEvents, ec.Topic = true, "kv"
	ec.Endpoint, ec.ReplayEndpoint = "tcp://*:0", "tcp://*:0"
	if ranks > 1 {
		base := testutil.FreePorts(st.t, 2*ranks)
		ec.Endpoint, ec.ReplayEndpoint = fmt.Sprintf("tcp://*:%d", base), fmt.Sprintf("tcp://*:%d", base+ranks)
	}
	ev, err := sim.NewVLLMEvents(ec, ranks, testLogger())
	if err != nil {
		st.t.Fatal(err)
	}
	sc.Worker, sc.Model, sc.BlockSize, sc.Ranks, sc.Speedup, sc.NewEmitter = id, testModel, testBlock, ranks, 1000, ev.Factory()
	eng, err := sim.New(sc)
	if err != nil {
		ev.Close()
		st.t.Fatal(err)
	}
	if fc.MaxModelLen == 0 {
		fc.MaxModelLen = max(st.o.maxModelLen, 8192)
	}
	if fc.ImageTokens == 0 {
		fc.ImageTokens = st.o.imageTokens
	}
	fc.Engine, fc.Model, fc.Logger = eng, testModel, testLogger()
	api, err := vllmapi.New(fc)
	if err != nil {
		st.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		st.t.Fatal(err)
	}
	e := &engine{id: id, eng: eng, events: ev, face: api, url: "http://" + ln.Addr().String(), ranks: ranks, ran: make(chan struct{})}
	e.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/tokenize":
			e.tokenizeCalls.Add(1)
		case strings.HasSuffix(r.URL.Path, "/render"):
			e.renderCalls.Add(1)
		case strings.HasSuffix(r.URL.Path, "/completions"):
			tp := r.Header.Get("traceparent")
			e.traceparent.Store(&tp)
		}
		if f := e.intercept.Load(); f != nil {
			(*f)(w, r, api)
			return
		}
		api.ServeHTTP(w, r)
	})}
	runCtx, stop := context.WithCancel(context.Background())
	e.stopRun = stop
	go func() { defer close(e.ran); _ = eng.Run(runCtx) }()
	go func() { _ = e.srv.Serve(ln) }()
	st.engines = append(st.engines, e)
	st.t.Cleanup(e.close)
	return e
}

// close stops the engine in sim serve's order: HTTP, engine, event sockets.
func (e *engine) close() {
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if e.srv.Shutdown(sctx) != nil {
		e.srv.Close()
	}
	_ = e.eng.Close(sctx)
	e.stopRun()
	<-e.ran
	_ = e.events.Close()
}

// startBridge runs a bridge on e as `kvrouter bridge` does, over its own
// NATS connection (staleIntervals: Config.StaleIntervals, 0 = default).
func (st *stack) startBridge(e *engine, staleIntervals int) *bridge.Bridge {
	st.t.Helper()
	p := e.events.Publisher(0)
	cfg := bridge.Config{
		EngineURL: e.url, KVEvents: p.Endpoint(), KVReplay: p.ReplayEndpoint(), Topic: "kv",
		Model: testModel, WorkerID: e.id, RouterBlockSize: host.DefaultBlockSize, DataParallelSize: e.ranks,
		// A scrape is stale after 1 s (20 intervals), not 150 ms: on a
		// loaded 2-core machine scrapes fall behind, and a worker flapping
		// to unavailable routes requests on load alone (no tokenizer) or
		// away from their sessions, which no test here is about.
		MetricsInterval: 50 * time.Millisecond, HealthInterval: 50 * time.Millisecond, ReplayTimeout: 2 * time.Second,
		Events: kvevents.PublisherConfig{MaxDelay: time.Millisecond}, Registry: testRegistry(),
		DrainWait: 2 * time.Second, Logger: testLogger().With("bridge", e.id), StaleIntervals: cmp.Or(staleIntervals, 20),
		Role: st.o.roles[e.id],
	}
	if cfg.Role == workers.RolePrefill {
		// An SGLang prefill engine's bootstrap: the simulator serves it on
		// its HTTP port.
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(e.url, "http://"))
		cfg.BootstrapPort, _ = strconv.Atoi(port)
	}
	nc, js := st.conn("worker:" + e.id)
	b, err := bridge.New(cfg, nc, js)
	if err != nil {
		st.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	st.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				st.t.Errorf("bridge %s: %v", e.id, err)
			}
		case <-time.After(15 * time.Second):
			st.t.Errorf("bridge %s did not stop", e.id)
		}
	})
	return b
}

// bridgeMetric is the sum of the bridge's series of metric name, read from
// its /metrics page (0 when absent).
func bridgeMetric(t *testing.T, b *bridge.Bridge, name string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	b.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("bridge /metrics: %d %s", rec.Code, rec.Body)
	}
	sum := 0.0
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("bridge /metrics line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// waitReady waits until every replica lists n ready workers (each of their
// ranks), each with a load report from its bridge's scrape.
func (st *stack) waitReady(n int) {
	st.t.Helper()
	testutil.Eventually(st.t, 15*time.Second, func() bool {
		for _, r := range st.replicas {
			w, err := st.list(r)
			if err != nil || len(w.Workers) != n*st.ranks {
				return false
			}
			for _, ws := range w.Workers {
				if ws.State != "ready" || ws.Reported == nil {
					return false
				}
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("every replica to list %d ready bridged workers: %s", n, st.workers())
	})
}

// list reads the model's workers from r's HTTP API, as an operator does
// (GET /v1/workers).
func (st *stack) list(r *host.Replica) (*api.WorkersResponse, error) {
	resp, err := st.http.Get("http://" + r.HTTPAddr() + "/v1/workers?model=" + testModel)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/workers on %s: %s: %s", r.ID(), resp.Status, body)
	}
	var w api.WorkersResponse
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("GET /v1/workers on %s: %w", r.ID(), err)
	}
	return &w, nil
}

// workers renders what each replica lists, for failure messages.
func (st *stack) workers() string {
	var b strings.Builder
	for _, r := range st.replicas {
		w, err := st.list(r)
		if err != nil {
			fmt.Fprintf(&b, "[%s: %v] ", r.ID(), err)
			continue
		}
		for _, ws := range w.Workers {
			active := -1
			if ws.Load != nil {
				active = ws.Load.ActiveRequests
			}
			fmt.Fprintf(&b, "[%s %s#%d %s indexed=%d active=%d] ", r.ID(), ws.Worker, ws.Rank, ws.State, ws.IndexedBlocks, active)
		}
	}
	return b.String()
}

// complete sends one completion with token-id prompt straight to e's HTTP
// face, as any client of the engine would.
func (st *stack) complete(e *engine, prompt []uint32) {
	st.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 2})
	resp, err := st.http.Post(e.url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		st.t.Fatalf("%s: %v", e.id, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		st.t.Fatalf("%s: %s: %s", e.id, resp.Status, out)
	}
}

// workload builds n prompts of 2-6 blocks in five families sharing their
// first two blocks, so that prefixes are reused and, with a small cache,
// blocks are evicted.
func workload(seed, n int) [][]uint32 {
	var prompts [][]uint32
	for i := range n {
		family := i % 5
		blocks := 2 + (i*7)%5
		toks := make([]uint32, 0, blocks*testBlock+3)
		for b := range blocks {
			for j := range testBlock {
				v := uint32(seed*1_000_003 + family*977 + b*101 + j)
				if b >= 2 {
					v += uint32(i * 131)
				}
				toks = append(toks, v)
			}
		}
		prompts = append(prompts, append(toks, 1, 2, 3))
	}
	return prompts
}

// The routers' indexes, fed only through the bridges (ZMQ -> JetStream),
// converge to what the engines really hold after a workload with evictions:
// every replica's indexed block count per worker rank equals the size of
// the engine's cache dump, and for every prompt of the workload the route
// API's overlap on its engine equals the leading prompt blocks in the
// engine's dump.
func TestBridgedIndexEqualsEngines(t *testing.T) {
	const kvBlocks = 32
	// Without the predicted index: the routes below that read overlaps
	// would otherwise add their own prompts to it (and share them with the
	// other replica) and the overlaps would not be the events' alone.
	st := startStack(t, stackOpts{engines: 2, replicas: 2, kvBlocks: kvBlocks, eventsOnly: true})
	prompts := map[string][][]uint32{}
	for i, e := range st.engines {
		prompts[e.id] = workload(i+1, 40)
		for _, p := range prompts[e.id] {
			st.complete(e, p)
		}
		if s := e.eng.Stats()[0]; s.RemovedBlocks == 0 {
			t.Fatalf("%s evicted nothing (stored %d blocks in a cache of %d): the test would not cover removals", e.id, s.StoredBlocks, kvBlocks)
		}
	}
	st.converged(prompts)
}

// A bridge started after its engine has already served a workload with
// evictions learns the engine's past from the replay socket: the index
// then equals the engine's cache as exactly as for a bridge that watched
// from the start.
func TestLateBridgeCatchesUpByReplay(t *testing.T) {
	const kvBlocks = 32
	st := startStack(t, stackOpts{engines: 2, replicas: 2, kvBlocks: kvBlocks, eventsOnly: true, lateBridges: 1})
	late := st.engines[1]
	prompts := map[string][][]uint32{late.id: workload(7, 40)}
	for _, p := range prompts[late.id][:30] {
		st.complete(late, p)
	}
	if s := late.eng.Stats()[0]; s.RemovedBlocks == 0 {
		t.Fatalf("%s evicted nothing before its bridge started", late.id)
	}
	b := st.startBridge(late, 0)
	st.waitReady(len(st.engines))
	for _, p := range prompts[late.id][30:] {
		st.complete(late, p)
	}
	st.converged(prompts)
	n := bridgeMetric(t, b, "kvr_bridge_replayed_batches_total")
	if n == 0 {
		t.Error("the late bridge received no batch from the replay socket")
	}
	t.Logf("the late bridge replayed %v batches", n)
	if n := bridgeMetric(t, b, "kvr_bridge_resyncs_total"); n != 0 {
		t.Errorf("the late bridge resynced %v times: it did not learn the past from the replay", n)
	}
}

// converged waits until every replica's index equals each engine's cache:
// the indexed block count per worker equals the size of the engine's dump,
// and for every prompt of prompts[worker] the route API's overlap on that
// worker equals the leading prompt blocks in the engine's dump. A full
// cache holds as many blocks after one more request as before: equal
// counts alone would pass with the last events still in flight.
func (st *stack) converged(prompts map[string][][]uint32) {
	st.t.Helper()
	if n := len(st.engines[0].eng.Dump()); n != 1 {
		st.t.Fatalf("engines have %d ranks, the test checks rank 0 only", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var last string
	t0 := time.Now()
	testutil.Eventually(st.t, 10*time.Second, func() bool {
		for _, e := range st.engines {
			if last = st.lagging(e); last != "" {
				return false
			}
			held := map[kvevents.SeqHash]bool{}
			for _, h := range e.eng.Dump()[workerref.Target{Worker: e.id, Rank: 0}] {
				held[h] = true
			}
			for _, r := range st.replicas {
				for i, p := range prompts[e.id] {
					want := 0
					for _, h := range kvevents.SeqHashes(nil, p, testBlock, kvevents.SeedFor("", "")) {
						if !held[h] {
							break
						}
						want++
					}
					if got := st.overlap(ctx, r, e.id, p); got != want {
						last = fmt.Sprintf("%s: prompt %d on %s: overlap %d blocks, the engine holds the first %d", r.ID(), i, e.id, got, want)
						return false
					}
				}
			}
		}
		return true
	}, func() string { return "the indexes to equal the engines' caches: " + last + "; " + st.workers() })
	st.t.Logf("indexes equal the engines' caches %v after the last request", time.Since(t0))
}

// overlap routes prompt to worker on r and frees the booking at once.
func (st *stack) overlap(ctx context.Context, r *host.Replica, worker string, prompt []uint32) int {
	st.t.Helper()
	rr := gateway.ReplicaRouter{R: r}
	var resp api.RouteResponse
	if err := rr.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: prompt, AllowedWorkers: []string{worker}}, &resp); err != nil {
		st.t.Fatalf("route on %s to %s: %v", r.ID(), worker, err)
	}
	if err := rr.Free(ctx, testModel, &resp); err != nil {
		st.t.Fatalf("free %s on %s: %v", resp.RequestID, r.ID(), err)
	}
	if resp.Worker != worker {
		st.t.Fatalf("route on %s allowed %s only and chose %s", r.ID(), worker, resp.Worker)
	}
	return resp.OverlapBlocks
}

// indexedAll waits until every replica indexes as many blocks on w
// (an engine's rank 0, "id#0") as that engine holds.
func (st *stack) indexedAll(w string) {
	st.t.Helper()
	id, _, _ := strings.Cut(w, "#")
	for _, e := range st.engines {
		if e.id != id {
			continue
		}
		var last string
		testutil.Eventually(st.t, 10*time.Second, func() bool {
			last = st.lagging(e)
			return last == ""
		}, func() string { return "the replicas to index " + w + "'s blocks: " + last })
	}
}

// lagging says which replica indexes a different number of blocks on e's
// rank 0 than e holds, or "" when none does.
func (st *stack) lagging(e *engine) string {
	held := len(e.eng.Dump()[workerref.Target{Worker: e.id, Rank: 0}])
	for _, r := range st.replicas {
		if got := st.indexed(r, e.id, 0); got != held {
			return fmt.Sprintf("%s indexes %d blocks on %s#0, the engine holds %d", r.ID(), got, e.id, held)
		}
	}
	return ""
}

// indexed is the replica's indexed block count on worker#rank (-1 when it
// does not list it).
func (st *stack) indexed(r *host.Replica, worker string, rank uint32) int {
	w, err := st.list(r)
	if err != nil {
		return -1
	}
	for _, ws := range w.Workers {
		if ws.Worker == worker && ws.Rank == rank {
			return ws.IndexedBlocks
		}
	}
	return -1
}

// gatewayURL starts a gateway over router (its Config changed by opts)
// and returns its base URL.
func (st *stack) gatewayURL(router gateway.Router, opts ...func(*gateway.Config)) string {
	st.t.Helper()
	cfg := gateway.Config{Router: router, Models: []string{testModel}, WorkersTTL: 100 * time.Millisecond,
		HTTPClient: &http.Client{Transport: &http.Transport{}}, Logger: testLogger()}
	for _, o := range opts {
		o(&cfg)
	}
	g, err := gateway.New(cfg)
	if err != nil {
		st.t.Fatal(err)
	}
	s := httptest.NewServer(g)
	st.t.Cleanup(func() { s.CloseClientConnections(); s.Close() })
	return s.URL
}

// gatewayURLWith is gatewayURL reporting to tel.
func (st *stack) gatewayURLWith(router gateway.Router, tel gateway.Telemetry) string {
	st.t.Helper()
	return st.gatewayURL(router, func(c *gateway.Config) { c.Telemetry = tel })
}

// waitIdle waits until no replica holds a booking on any worker.
func (st *stack) waitIdle() {
	st.t.Helper()
	testutil.Eventually(st.t, 10*time.Second, func() bool {
		for _, r := range st.replicas {
			w, err := st.list(r)
			if err != nil {
				return false
			}
			for _, ws := range w.Workers {
				if ws.Load == nil || ws.Load.ActiveRequests != 0 || ws.Load.PrefillTokens != 0 {
					return false
				}
			}
		}
		return true
	}, func() string { return "every booking to be freed: " + st.workers() })
}

// completed is each engine's count of finished requests, by w#r.
func (st *stack) completed() map[string]uint64 {
	out := map[string]uint64{}
	for _, e := range st.engines {
		out[e.id+"#0"] = e.eng.Stats()[0].Completed
	}
	return out
}

func longText(seed string, n int) string {
	return strings.Repeat(seed+" ", n/(len(seed)+1)+1)[:n]
}

// The official OpenAI client through the gateway, over bridged engines:
// whole and streamed chat replies; the turns of one conversation (one
// X-Session-Id) land on one worker, and the engine reports the cached
// prefix; afterwards no replica holds a booking.
func TestOpenAIClientThroughBridgesAndGateway(t *testing.T) {
	st := startStack(t, stackOpts{engines: 2, replicas: 2, kvBlocks: 4096})
	// One gateway routes in process over replica 0, the other over NATS
	// (whichever replica answers): both must agree on the session.
	gws := []string{
		st.gatewayURL(gateway.ReplicaRouter{R: st.replicas[0]}),
		st.gatewayURL(gateway.ClientRouter{C: api.NewClient(natstest.Connect(t, st.srv), "", nil)}),
	}
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	clients := make([]openai.Client, len(gws))
	for i, u := range gws {
		clients[i] = openai.NewClient(option.WithBaseURL(u+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0), option.WithHTTPClient(hc))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// stream_options only when streaming: vLLM refuses it otherwise.
	params := func(stream bool, msgs ...openai.ChatCompletionMessageParamUnion) openai.ChatCompletionNewParams {
		p := openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, MaxCompletionTokens: openai.Int(8)}
		if stream {
			p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		}
		return p
	}
	known := map[string]bool{"e0#0": true, "e1#0": true}

	t.Run("whole", func(t *testing.T) {
		var hr *http.Response
		r, err := clients[0].Chat.Completions.New(ctx, params(false, openai.UserMessage(longText("a whole reply", 200))), option.WithResponseInto(&hr))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Choices) != 1 || r.Choices[0].Message.Content == "" || r.Usage.CompletionTokens != 8 {
			t.Errorf("reply %+v", r)
		}
		if w := hr.Header.Get(gateway.HeaderWorker); !known[w] {
			t.Errorf("%s = %q", gateway.HeaderWorker, w)
		}
	})
	t.Run("stream", func(t *testing.T) {
		var hr *http.Response
		s := clients[1].Chat.Completions.NewStreaming(ctx, params(true, openai.UserMessage(longText("a streamed reply", 200))), option.WithResponseInto(&hr))
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens != 8 {
			t.Errorf("accumulated reply %+v", acc.ChatCompletion)
		}
		if w := hr.Header.Get(gateway.HeaderWorker); !known[w] {
			t.Errorf("%s = %q", gateway.HeaderWorker, w)
		}
	})
	t.Run("conversation", func(t *testing.T) {
		msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage(longText("tell me about caches", 400))}
		var first string
		before := st.completed()
		for turn := range 4 {
			c := clients[turn%2] // alternate gateways (and routers)
			var hr *http.Response
			var content string
			var cached int64
			opts := []option.RequestOption{option.WithHeader("X-Session-Id", "conv-1"), option.WithResponseInto(&hr)}
			if turn%2 == 0 {
				r, err := c.Chat.Completions.New(ctx, params(false, msgs...), opts...)
				if err != nil {
					t.Fatalf("turn %d: %v", turn, err)
				}
				content, cached = r.Choices[0].Message.Content, r.Usage.PromptTokensDetails.CachedTokens
			} else {
				s := c.Chat.Completions.NewStreaming(ctx, params(true, msgs...), opts...)
				var acc openai.ChatCompletionAccumulator
				for s.Next() {
					acc.AddChunk(s.Current())
				}
				if err := s.Err(); err != nil {
					t.Fatalf("turn %d: %v", turn, err)
				}
				content, cached = acc.Choices[0].Message.Content, acc.Usage.PromptTokensDetails.CachedTokens
			}
			w, outcome := hr.Header.Get(gateway.HeaderWorker), hr.Header.Get(gateway.HeaderSessionOutcome)
			switch {
			case !known[w]:
				t.Fatalf("turn %d: %s = %q", turn, gateway.HeaderWorker, w)
			case turn == 0 && outcome != api.OutcomeCreated:
				t.Fatalf("turn 0: session outcome %q, want %q", outcome, api.OutcomeCreated)
			case turn == 0:
				first = w
			case outcome == api.OutcomeRebound:
				t.Fatalf("turn %d: the session was rebound to %s", turn, w)
			case w != first:
				t.Fatalf("turn %d went to %s, the conversation is on %s (outcome %s)", turn, w, first, hr.Header.Get(gateway.HeaderSessionOutcome))
			case cached == 0:
				t.Errorf("turn %d: cached_tokens 0 on %s", turn, w)
			}
			if n, _ := strconv.Atoi(hr.Header.Get(gateway.HeaderOverlapBlocks)); turn > 0 && n == 0 {
				t.Errorf("turn %d: the router saw no overlap on %s (%s %q)", turn, w, gateway.HeaderOverlapBlocks, hr.Header.Get(gateway.HeaderOverlapBlocks))
			}
			msgs = append(msgs, openai.AssistantMessage(content), openai.UserMessage("and then? "+strconv.Itoa(turn)))
			// A user reads the reply before the next turn; without that
			// pause the next turn may outrun the engine's KV events to the
			// replica the other gateway reaches (about one run in ten).
			st.indexedAll(w)
		}
		// The header names the engine that really served every turn.
		after := st.completed()
		for w := range known {
			want := uint64(0)
			if w == first {
				want = 4
			}
			if got := after[w] - before[w]; got != want {
				t.Errorf("engine %s completed %d requests of the conversation, want %d", w, got, want)
			}
		}
	})
	st.waitIdle()
}
