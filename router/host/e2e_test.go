package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/telemetry"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoredGoroutines()...)
}

const testModel = "m"

// testRegistry: short TTLs so departures show within a second or two.
func testRegistry() workers.RegistryConfig {
	return workers.RegistryConfig{TTL: time.Second, Heartbeat: 300 * time.Millisecond, MarkerTTL: time.Second,
		Logger: slog.New(slog.DiscardHandler)}
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("KVR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// stack is an embedded server, a simulated fleet and router replicas in one
// process.
type stack struct {
	t        testing.TB
	srv      *server.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	fleets   []*sim.Fleet
	replicas []*Replica
	proms    []*telemetry.Prometheus
	spans    *tracetest.SpanRecorder
	client   *api.Client
}

type stackOpts struct {
	workers    int
	replicas   int
	mutate     func(i int, c *Config)
	maxPayload int32 // the server's max_payload; 0 = 8 MiB
	// srv, when set, is the server to use (a cluster's node) instead of a
	// new embedded one.
	srv *server.Server
}

func startStack(t testing.TB, o stackOpts) *stack {
	t.Helper()
	if o.maxPayload == 0 {
		o.maxPayload = 8 << 20
	}
	st := &stack{t: t, srv: o.srv}
	if st.srv == nil {
		st.srv = natstest.Start(t, natstest.WithMaxPayload(o.maxPayload))
	}
	st.nc, st.js = natstest.JetStream(t, st.srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if o.workers > 0 {
		st.addFleet(ctx, "sim", o.workers)
	}
	st.spans = tracetest.NewSpanRecorder()
	for i := 0; i < o.replicas; i++ {
		prom, err := telemetry.NewPrometheus(false)
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(st.spans))
		nc := natstest.Connect(t, st.srv)
		cfg := Config{
			ReplicaID:      fmt.Sprintf("rep-%d", i),
			Models:         []string{testModel},
			Registry:       testRegistry(),
			Bindings:       bindings.Config{IdleTTL: 10 * time.Second, MarkerTTL: time.Second},
			HTTPAddr:       "127.0.0.1:0",
			MetricsHandler: prom.Handler,
			Telemetry:      Telemetry{TracerProvider: tp, MeterProvider: prom.Provider},
			Logger:         testLogger(t).With("replica", i),
		}
		if o.mutate != nil {
			o.mutate(i, &cfg)
		}
		r, err := New(nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			_ = r.Close(context.Background())
			t.Fatalf("replica %d start: %v", i, err)
		}
		st.replicas = append(st.replicas, r)
		st.proms = append(st.proms, prom)
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := r.Close(cctx); err != nil {
				t.Errorf("replica close: %v", err)
			}
			_ = prom.Shutdown(cctx)
			_ = tp.Shutdown(cctx)
		})
	}
	st.client = api.NewClient(st.nc, "", nil)
	return st
}

// addFleet starts n simulated workers with ids <prefix>-0..n-1.
func (st *stack) addFleet(ctx context.Context, prefix string, n int) *sim.Fleet {
	st.t.Helper()
	f, err := sim.NewFleet(sim.FleetConfig{
		Count: n, IDPrefix: prefix,
		Engine:     sim.Config{Model: testModel, KVBlocks: 4096, Speedup: 50},
		NewEmitter: sim.PublisherFactory(st.js, kvevents.PublisherConfig{Model: testModel, MaxDelay: time.Millisecond}),
		Registry:   testRegistry(),
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		st.t.Fatal(err)
	}
	if err := f.Start(ctx, st.nc, st.js); err != nil {
		st.t.Fatal(err)
	}
	st.fleets = append(st.fleets, f)
	st.t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.Stop(cctx)
	})
	return f
}

// waitWorkers waits until every replica knows n workers.
func (st *stack) waitWorkers(n int) {
	st.t.Helper()
	testutil.Eventually(st.t, 10*time.Second, func() bool {
		for _, r := range st.replicas {
			w, _ := r.Workers(testModel)
			if len(w.Workers) != n {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("replicas do not all see %d workers", n) })
}

// idle: no predicted load left, neither booked (local or synced from the
// other replica) nor from a load report taken while the worker was busy
// (a report's correction holds until the next one, 1 s later).
func idle(ws api.WorkerStatus) bool {
	return ws.Load == nil || (ws.Load.ActiveRequests == 0 && ws.Load.DecodeBlocks == 0 && ws.Load.PrefillTokens == 0)
}

// waitWorker waits until every replica's view of worker satisfies cond.
func (st *stack) waitWorker(worker string, cond func(api.WorkerStatus) bool) {
	st.t.Helper()
	testutil.Eventually(st.t, 10*time.Second, func() bool {
		for _, r := range st.replicas {
			w, _ := r.Workers(testModel)
			ok := false
			for _, ws := range w.Workers {
				if ws.Worker == worker && cond(ws) {
					ok = true
				}
			}
			if !ok {
				return false
			}
		}
		return true
	}, func() string { return "worker " + worker + " not in the expected state on every replica" })
}

func tokens(seed, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(seed*1_000_003+i*7919) % 100_000
	}
	return out
}

// generate runs the request on the worker the router chose, as a client
// would, and reports prefill-done and free.
func (st *stack) generate(ctx context.Context, resp *api.RouteResponse, toks []uint32) {
	st.t.Helper()
	var once sync.Once
	_, err := sim.Generate(ctx, st.nc, resp.Endpoint, &sim.GenerateRequest{RequestID: resp.RequestID, TokenIDs: toks,
		MaxTokens: 4, Rank: resp.Rank}, func(*sim.GenerateReply) {
		once.Do(func() {
			if err := st.client.PrefillDone(ctx, testModel, resp); err != nil {
				st.t.Errorf("prefill_done %s: %v", resp.RequestID, err)
			}
		})
	})
	if err != nil {
		st.t.Fatalf("generate on %s: %v", resp.Endpoint, err)
	}
	if err := st.client.Free(ctx, testModel, resp); err != nil {
		st.t.Errorf("free %s: %v", resp.RequestID, err)
	}
}

func httpDo(t testing.TB, method, url string, body []byte) (int, []byte) {
	t.Helper()
	return httpDoAuth(t, method, url, "", body)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestEndToEnd(t *testing.T) {
	st := startStack(t, stackOpts{workers: 4, replicas: 2})
	st.waitWorkers(4)
	ctx := ctxT(t)

	t.Run("prefix lands on the worker that holds it", func(t *testing.T) {
		prefix := tokens(1, 512)
		first, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: prefix, ExpectedOutputTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		if first.PromptBlocks != 32 || first.Endpoint == "" || first.Replica == "" {
			t.Fatalf("first route: %+v", first)
		}
		st.generate(ctx, first, prefix)
		// Wait until both replicas indexed the worker's blocks and saw the
		// request's booking freed (booking sync is asynchronous).
		st.waitWorker(first.Worker, func(ws api.WorkerStatus) bool { return ws.IndexedBlocks >= 32 && idle(ws) })
		// The six requests go to one replica, whose view of its own
		// bookings is exact. Through both, a request could meet the other
		// replica's booking of the one before still in flight (booking
		// sync is asynchronous, and an idle view taken before a booking
		// arrived says nothing of it). Both replicas' indexes hold the
		// prefix (above).
		rep := st.replicas[0]
		for i := 0; i < 6; i++ {
			req := &api.RouteRequest{Model: testModel, TokenIDs: append(append([]uint32(nil), prefix...), tokens(100+i, 64)...), ExpectedOutputTokens: 4}
			var got api.RouteResponse
			if err := rep.Route(ctx, req, &got); err != nil {
				t.Fatal(err)
			}
			if got.Worker != first.Worker || got.OverlapBlocks != 32 || got.PromptBlocks != 36 {
				for _, r := range st.replicas {
					w, _ := r.Workers(testModel)
					for _, ws := range w.Workers {
						t.Logf("%s: %s indexed %d load %+v", r.ID(), ws.Worker, ws.IndexedBlocks, ws.Load)
					}
				}
				t.Logf("resp %+v first %+v", got, first)
				t.Fatalf("request %d went to %s with overlap %d/%d, want %s with 32/36", i, got.Worker, got.OverlapBlocks, got.PromptBlocks, first.Worker)
			}
			if err := rep.freeLocal(ctx, &got); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("session stays on its worker across replicas", func(t *testing.T) {
		var worker string
		for i := 0; i < 8; i++ {
			r := st.replicas[i%2]
			body := api.AppendRouteRequest(nil, &api.RouteRequest{Model: testModel, SessionID: "chat-1", TokenIDs: tokens(200+i, 64)})
			code, b := httpDo(t, "POST", "http://"+r.HTTPAddr()+"/v1/route", body)
			if code != 200 {
				t.Fatalf("route via %s: %d %s", r.ID(), code, b)
			}
			var resp api.RouteResponse
			if err := json.Unmarshal(b, &resp); err != nil {
				t.Fatal(err)
			}
			if resp.Binding == nil {
				t.Fatalf("no binding info: %s", b)
			}
			if i == 0 {
				worker = resp.Worker
				if resp.Binding.Outcome != api.OutcomeCreated {
					t.Fatalf("first outcome %q", resp.Binding.Outcome)
				}
			} else if resp.Worker != worker || resp.Binding.Outcome == api.OutcomeCreated {
				t.Fatalf("request %d via %s went to %s (%s), session bound to %s", i, r.ID(), resp.Worker, resp.Binding.Outcome, worker)
			}
			// free through the other replica: forwarded to the owner
			other := st.replicas[(i+1)%2]
			code, b = httpDo(t, "DELETE", "http://"+other.HTTPAddr()+"/v1/requests/"+resp.RequestID+"?model=m&replica="+resp.Replica+"&fence="+resp.Fence, nil)
			if code != 200 {
				t.Fatalf("free via other replica: %d %s", code, b)
			}
		}
		// Via NATS too (either replica answers).
		for i := 0; i < 4; i++ {
			resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, SessionID: "chat-1", TokenIDs: tokens(300+i, 64)})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Worker != worker {
				t.Fatalf("NATS route went to %s, session bound to %s", resp.Worker, worker)
			}
			_ = st.client.Free(ctx, testModel, resp)
		}
		s, err := st.client.Session(ctx, testModel, "chat-1")
		if err != nil || s.Worker != worker || s.Mode != "hard" {
			t.Fatalf("session: %+v %v", s, err)
		}
		code, b := httpDo(t, "GET", "http://"+st.replicas[1].HTTPAddr()+"/v1/sessions/chat-1", nil)
		if code != 200 || !strings.Contains(string(b), worker) {
			t.Fatalf("GET session: %d %s", code, b)
		}
		// A pin that agrees with the binding is fine: worker-only (the
		// binding names a rank; the host passes both through unchanged and
		// the scheduler's pin rule goes to the bound rank) and ranked.
		if !s.HasRank {
			t.Fatalf("session bound without a rank: %+v", s)
		}
		for i, pin := range []*api.WorkerRef{{Worker: worker}, {Worker: worker, Rank: s.Rank, HasRank: true}} {
			agreeing, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, SessionID: "chat-1", TokenIDs: tokens(2+i, 32), Pin: pin})
			if err != nil || agreeing.Worker != worker || agreeing.Rank != s.Rank {
				t.Fatalf("agreeing pin %s: %+v %v", pin.Target().String(), agreeing, err)
			}
			_ = st.client.Free(ctx, testModel, agreeing)
		}
		// A pin that disagrees with the binding: 409.
		other := "sim-0"
		if worker == other {
			other = "sim-1"
		}
		_, err = st.client.Route(ctx, &api.RouteRequest{Model: testModel, SessionID: "chat-1", TokenIDs: tokens(1, 32), Pin: &api.WorkerRef{Worker: other}})
		var ae *api.Error
		if !errors.Is(err, api.ErrPinConflict) || !errors.As(err, &ae) || ae.Field != "pin" || !strings.Contains(ae.Message, `session "chat-1"`) {
			t.Fatalf("conflicting pin: %v", err)
		}
		if err := st.client.EndSession(ctx, testModel, "chat-1"); err != nil {
			t.Fatal(err)
		}
		// Reads come from each replica's watch-fed cache: the other
		// replica sees the end within the watch delay.
		testutil.Eventually(t, 5*time.Second, func() bool {
			_, err := st.client.Session(ctx, testModel, "chat-1")
			return errors.Is(err, api.ErrNotFound)
		}, func() string { return "ended session still readable" })
	})

	t.Run("departed worker is routed around", func(t *testing.T) {
		extra := st.addFleet(ctx, "gone", 1)
		st.waitWorkers(5)
		resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(400, 64), Pin: &api.WorkerRef{Worker: "gone-0"}})
		if err != nil || resp.Worker != "gone-0" {
			t.Fatalf("pinned route: %+v %v", resp, err)
		}
		_ = st.client.Free(ctx, testModel, resp)
		// A session bound (Hard) to the worker that will depart.
		resp, err = st.client.Route(ctx, &api.RouteRequest{Model: testModel, SessionID: "s-gone", TokenIDs: tokens(401, 64), Pin: &api.WorkerRef{Worker: "gone-0"}})
		if err != nil || resp.Worker != "gone-0" {
			t.Fatalf("pinned session route: %+v %v", resp, err)
		}
		_ = st.client.Free(ctx, testModel, resp)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := extra.Stop(sctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		st.waitWorkers(4)
		for i := 0; i < 20; i++ {
			resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(500+i, 64)})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Worker == "gone-0" {
				t.Fatal("routed to a departed worker")
			}
			_ = st.client.Free(ctx, testModel, resp)
		}
		resp, err = st.client.Route(ctx, &api.RouteRequest{Model: testModel, SessionID: "s-gone", TokenIDs: tokens(402, 64)})
		if err != nil || resp.Worker == "gone-0" || resp.Binding.Outcome != api.OutcomeRebound {
			t.Fatalf("session of a departed worker: %+v %v", resp, err)
		}
		_ = st.client.Free(ctx, testModel, resp)
		_, err = st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(403, 64), Pin: &api.WorkerRef{Worker: "gone-0"}})
		if !errors.Is(err, api.ErrNoEligibleWorker) {
			t.Fatalf("pin to departed worker: %v", err)
		}
	})

	t.Run("bad requests get the documented errors", func(t *testing.T) {
		long := strings.Repeat("s", api.MaxSessionIDLen+1)
		cases := []struct {
			name, body string
			status     int
			code       string
			field      string
		}{
			{"bad JSON", `{"model":`, 400, api.CodeBadRequest, "model"},
			{"bad JSON body", `{"model":"m",}`, 400, api.CodeBadRequest, "body"},
			{"not an object", `[1,2]`, 400, api.CodeBadRequest, "body"},
			{"missing model", `{"token_ids":[1,2,3]}`, 400, api.CodeBadRequest, "model"},
			{"unknown model", `{"model":"nope","token_ids":[1]}`, 400, api.CodeBadRequest, "model"},
			{"no prompt", `{"model":"m"}`, 400, api.CodeBadRequest, "token_ids"},
			{"both prompts", `{"model":"m","token_ids":[1],"block_hashes":[1],"block_size":16}`, 400, api.CodeBadRequest, "token_ids"},
			{"hashes without block size", `{"model":"m","block_hashes":[1]}`, 400, api.CodeBadRequest, "block_size"},
			{"wrong block size", `{"model":"m","token_ids":[1],"block_size":32}`, 400, api.CodeBadRequest, "block_size"},
			{"negative token", `{"model":"m","token_ids":[-1]}`, 400, api.CodeBadRequest, "token_ids"},
			{"over-long session id", `{"model":"m","token_ids":[1],"session_id":"` + long + `"}`, 400, api.CodeBadRequest, "session_id"},
			{"negative output", `{"model":"m","token_ids":[1],"expected_output_tokens":-5}`, 400, api.CodeBadRequest, "expected_output_tokens"},
			{"bad version", `{"v":2,"model":"m","token_ids":[1]}`, 400, api.CodeBadRequest, "v"},
			{"pin and prefer", `{"model":"m","token_ids":[1],"pin":{"worker":"sim-0"},"prefer":{"worker":"sim-1"}}`, 400, api.CodeBadRequest, "prefer"},
			{"pin without worker", `{"model":"m","token_ids":[1],"pin":{"rank":0}}`, 400, api.CodeBadRequest, "pin.worker"},
			{"unknown pinned worker", `{"model":"m","token_ids":[1],"pin":{"worker":"nobody"}}`, 503, api.CodeNoEligibleWorker, ""},
			{"allowed set of unknown workers", `{"model":"m","token_ids":[1],"allowed_workers":["nobody"]}`, 503, api.CodeNoEligibleWorker, ""},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				check := func(via string, e *api.Error) {
					t.Helper()
					if e == nil || e.Status != c.status || e.Code != c.code || (c.field != "" && e.Field != c.field) {
						t.Fatalf("%s: got %#v, want %d %s field %q", via, e, c.status, c.code, c.field)
					}
				}
				code, b := httpDo(t, "POST", "http://"+st.replicas[0].HTTPAddr()+"/v1/route", []byte(c.body))
				e := api.DecodeError(b)
				if code != c.status {
					t.Fatalf("HTTP status %d, want %d: %s", code, c.status, b)
				}
				check("HTTP", e)
				reply, err := st.nc.Request(api.RouteSubject("", testModel), []byte(c.body), 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if got := reply.Header.Get(api.HeaderStatus); got != fmt.Sprint(c.status) {
					t.Fatalf("NATS %s header %q, want %d", api.HeaderStatus, got, c.status)
				}
				check("NATS", api.DecodeError(reply.Data))
			})
		}
		// Lifecycle and session errors.
		for _, c := range []struct {
			name, method, path string
			status             int
			field              string
		}{
			{"unknown request", "DELETE", "/v1/requests/nope?model=m", 404, "request_id"},
			{"unknown request prefill", "POST", "/v1/requests/nope/prefill_done?model=m", 404, "request_id"},
			{"unknown request serve_whole", "POST", "/v1/requests/nope/serve_whole?model=m", 404, "request_id"},
			{"unknown session", "GET", "/v1/sessions/nope?model=m", 404, "session_id"},
			{"end unknown session", "DELETE", "/v1/sessions/nope?model=m", 404, "session_id"},
			{"bad attempt", "DELETE", "/v1/requests/x?attempt=-1", 400, "attempt"},
			{"unknown model on workers", "GET", "/v1/workers?model=zzz", 400, "model"},
			{"no such endpoint", "GET", "/v2/route", 404, ""},
			{"wrong method", "GET", "/v1/route", 405, ""},
		} {
			t.Run(c.name, func(t *testing.T) {
				code, b := httpDo(t, c.method, "http://"+st.replicas[1].HTTPAddr()+c.path, nil)
				e := api.DecodeError(b)
				if code != c.status || e == nil || e.Status != c.status || e.Field != c.field {
					t.Fatalf("%s %s: %d %s", c.method, c.path, code, b)
				}
			})
		}
		if err := st.client.Cancel(ctx, testModel, "nope", strings.Repeat("0", api.MinRequestKeyLen)); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("cancel unknown over NATS: %v", err)
		}
		// The replicas are still fine.
		if _, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(9, 64)}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("trace context passes through NATS and HTTP", func(t *testing.T) {
		const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		m := nats.NewMsg(api.RouteSubject("", testModel))
		m.Header["traceparent"] = []string{tp} // lowercase, as W3C clients write it
		m.Data = api.AppendRouteRequest(nil, &api.RouteRequest{Model: testModel, TokenIDs: tokens(10, 64)})
		reply, err := st.nc.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got := reply.Header.Get("traceparent")
		if !strings.HasPrefix(got, "00-4bf92f3577b34da6a3ce929d0e0e4736-") || got == tp {
			t.Fatalf("reply traceparent %q: want the route span in the caller's trace", got)
		}
		names := map[string]bool{}
		for _, s := range st.spans.Ended() {
			if s.SpanContext().TraceID().String() == "4bf92f3577b34da6a3ce929d0e0e4736" {
				names[s.Name()] = true
			}
		}
		for _, n := range []string{"kvrouter.route", "index.lookup", "scheduler.queue_wait", "scheduler.select"} {
			if !names[n] {
				t.Errorf("span %q missing from the caller's trace (have %v)", n, names)
			}
		}
		req, _ := http.NewRequest("POST", "http://"+st.replicas[0].HTTPAddr()+"/v1/route",
			bytes.NewReader(api.AppendRouteRequest(nil, &api.RouteRequest{Model: testModel, SessionID: "traced", TokenIDs: tokens(11, 64)})))
		propagation.TraceContext{}.Inject(context.Background(), propagation.HeaderCarrier(req.Header))
		req.Header.Set("traceparent", "00-11111111111111111111111111111111-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !strings.HasPrefix(resp.Header.Get("traceparent"), "00-11111111111111111111111111111111-") {
			t.Fatalf("HTTP reply traceparent %q", resp.Header.Get("traceparent"))
		}
		found := false
		for _, s := range st.spans.Ended() {
			if s.Name() == "bindings.commit" && s.SpanContext().TraceID().String() == "11111111111111111111111111111111" {
				found = true
			}
		}
		if !found {
			t.Error("no bindings.commit span in the HTTP caller's trace")
		}
	})

	t.Run("metrics", func(t *testing.T) {
		code, b := httpDo(t, "GET", "http://"+st.replicas[0].HTTPAddr()+"/metrics", nil)
		if code != 200 {
			t.Fatalf("/metrics: %d", code)
		}
		text := string(b)
		for _, name := range []string{
			"kvr_route_duration_seconds_bucket", "kvr_route_requests_total{code=\"ok\"}",
			"kvr_queue_depth", "kvr_queue_wait_seconds_bucket", "kvr_route_overlap_ratio_bucket",
			"kvr_binding_outcomes_total{outcome=\"created\"}", "kvr_binding_outcomes_total{outcome=\"rebound\"}",
			"kvr_binding_outcomes_total{outcome=\"conflict\"}", "kvr_binding_outcomes_total{outcome=\"rejected\"}",
			"kvr_events_lag", "kvr_events_gaps_total", "kvr_events_resyncs_total", "kvr_index_blocks",
			"kvr_index_entries", "kvr_worker_predicted_active_requests", "kvr_worker_predicted_prefill_tokens",
			"kvr_bad_requests_total", "kvr_ready 1", "kvr_scheduler_cached_share{",
		} {
			if !strings.Contains(text, name) {
				t.Errorf("/metrics lacks %s", name)
			}
		}
		if t.Failed() {
			t.Log(text)
		}
	})

	t.Run("health and readiness", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz"} {
			if code, b := httpDo(t, "GET", "http://"+st.replicas[0].HTTPAddr()+p, nil); code != 200 {
				t.Fatalf("%s: %d %s", p, code, b)
			}
		}
	})
}
