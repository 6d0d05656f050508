package epp

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// chatBody is a chat request body: the messages alternate user and
// assistant, starting with a system prompt.
func chatBody(stream bool, maxTokens int, system string, turns ...string) []byte {
	msgs := []map[string]string{{"role": "system", "content": system}}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": t})
	}
	b, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs, "stream": stream, "max_tokens": maxTokens})
	return b
}

func chat(body []byte, seed uint64) envoyRequest {
	return envoyRequest{method: http.MethodPost, path: gateway.PathChat, body: body, chunks: 5, seed: seed}
}

func (f *fleet) mustEnvoy(t *testing.T, q envoyRequest) envoyResult {
	t.Helper()
	res, err := f.envoy(ctxT(t), q)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A two-turn chat: the second turn lands on the worker holding the first
// turn's prefix (it reports overlap), body chunks split anywhere and with
// trailers or not; the destination carries fallbacks on other workers;
// every booking is freed at the end of the reply.
func TestTwoTurnsLandOnPrefixHolder(t *testing.T) {
	f := startFleet(t, 3, nil)
	system := longText("you are a careful assistant who answers about caches", 600)
	first := f.mustEnvoy(t, chat(chatBody(true, 8, system, "what is a KV cache?"), 1))
	if first.status != 200 || !strings.Contains(string(first.reply), "[DONE]") {
		t.Fatalf("turn 1: status %d, reply %q", first.status, first.reply)
	}
	if len(first.dest) != 3 || first.dest[0] != first.served {
		t.Fatalf("turn 1 destination %v: want the pick and 2 fallbacks", first.dest)
	}
	for _, d := range first.dest {
		if f.engineAt(d) == nil {
			t.Fatalf("destination %s is no engine's address", d)
		}
	}
	q := chat(chatBody(true, 8, system, "what is a KV cache?", "a cache of attention keys and values", "and prefix caching?"), 2)
	q.trailers, q.chunks = true, 9
	second := f.mustEnvoy(t, q)
	if second.dest[0] != first.dest[0] {
		t.Fatalf("turn 2 went to %s, the prefix is on %s", second.dest[0], first.dest[0])
	}
	if n, _ := strconv.Atoi(second.respSet[strings.ToLower(gateway.HeaderOverlapBlocks)]); n == 0 {
		t.Errorf("turn 2: overlap %q blocks, want > 0", second.respSet[strings.ToLower(gateway.HeaderOverlapBlocks)])
	}
	if second.set[strings.ToLower(gateway.RankHeader)] != "0" {
		t.Errorf("rank header %q, want 0", second.set[strings.ToLower(gateway.RankHeader)])
	}
	f.waitIdle()
}

// A subset hint that leaves out the worker holding the prefix is honoured:
// the pick and its fallbacks come from the subset. An empty subset, or one
// with no worker of the pool, is 503.
func TestSubsetHint(t *testing.T) {
	f := startFleet(t, 3, nil)
	system := longText("subset hints decide", 600)
	first := f.mustEnvoy(t, chat(chatBody(false, 4, system, "hello"), 3))
	var others []string
	for _, e := range f.engines {
		if e.addr != first.dest[0] {
			others = append(others, e.addr)
		}
	}
	q := chat(chatBody(false, 4, system, "hello", "hi", "again"), 4)
	q.subset, q.hinted = others, true
	res := f.mustEnvoy(t, q)
	if res.status != 200 || slices.Contains(res.dest, first.dest[0]) {
		t.Fatalf("status %d, destination %v includes %s, which the subset %v leaves out", res.status, res.dest, first.dest[0], others)
	}
	for _, subset := range [][]string{{}, {"10.255.0.1:8000"}} {
		q.subset = subset
		res := f.mustEnvoy(t, q)
		if res.imm == nil || res.status != http.StatusServiceUnavailable || !strings.Contains(string(res.imm.GetBody()), "no_eligible_worker") {
			t.Fatalf("subset %v: status %d, body %q: want 503 no_eligible_worker", subset, res.status, res.imm.GetBody())
		}
	}
	f.waitIdle()
}

// Nothing eligible is 503 in OpenAI's error shape; a body over the limit
// is 413 while it streams; an unknown model is 404; a bad body 400.
func TestImmediateResponses(t *testing.T) {
	f := startFleet(t, 1, nil)
	big := chat(chatBody(false, 4, longText("x", int(f.g.MaxBodyBytes())+10), "hi"), 5)
	big.chunks = 40
	cases := []struct {
		name string
		q    envoyRequest
		want int
		code string
	}{
		{"too large", big, http.StatusRequestEntityTooLarge, "request_too_large"},
		{"unknown model", chat([]byte(`{"model":"nope","messages":[{"role":"user","content":"hi"}]}`), 6), http.StatusNotFound, "model_not_found"},
		{"bad json", chat([]byte(`{"model":`), 7), http.StatusBadRequest, "invalid_request_error"},
		{"session too long", func() envoyRequest {
			q := chat(chatBody(false, 4, "s", "hi"), 8)
			q.header = map[string]string{gateway.DefaultSessionHeader: strings.Repeat("s", 4096)}
			return q
		}(), http.StatusBadRequest, "invalid_request_error"},
	}
	for _, c := range cases {
		res := f.mustEnvoy(t, c.q)
		if res.imm == nil || res.status != c.want || !strings.Contains(string(res.imm.GetBody()), `"code":"`+c.code+`"`) {
			t.Errorf("%s: status %d body %.200q, want %d %s", c.name, res.status, res.imm.GetBody(), c.want, c.code)
		}
	}
	// No worker left: 503.
	for _, e := range f.engines {
		if err := e.reg.Deregister(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return len(f.g.Engines(context.Background(), testModel)) == 0 },
		func() string { return "the drained worker is still live" })
	res := f.mustEnvoy(t, chat(chatBody(false, 4, "s", "hi"), 9))
	if res.imm == nil || res.status != http.StatusServiceUnavailable {
		t.Fatalf("no worker: status %d, want 503", res.status)
	}
	f.waitIdle()
}

// A client that goes away (Envoy resets the stream) frees the booking,
// mid-reply, after the pick before the reply, or mid-request-body.
func TestResetFreesBooking(t *testing.T) {
	f := startFleet(t, 2, nil)
	for i, reset := range []int{2, -1, -2} {
		q := chat(chatBody(true, 3000, longText("a long story", 200), "tell it"), uint64(10+i))
		q.resetAfter = reset
		if _, err := f.envoy(ctxT(t), q); err != nil {
			t.Fatalf("reset %d: %v", reset, err)
		}
		f.waitIdle()
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, e := range f.engines {
			if l := e.eng.Load()[0]; l.ActiveRequests+l.WaitingRequests != 0 {
				return false
			}
		}
		return true
	}, func() string { return "an engine still runs the reset request" })
}

// The proxy retried on a fallback: the served endpoint differs from the
// pick, so the pick's booking is freed as soon as the proxy says so.
func TestServedByFallback(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	f := startFleet(t, 2, func(c *Config) {
		c.Telemetry.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	q := chat(chatBody(true, 8, longText("fallbacks", 100), "hi"), 13)
	q.serveFrom = 1
	res := f.mustEnvoy(t, q)
	if res.status != 200 || res.served == res.dest[0] {
		t.Fatalf("status %d, served %s of %v", res.status, res.served, res.dest)
	}
	if n := testutil.SumCounter(t, reader, "kvr_epp_served_elsewhere_total"); n != 1 {
		t.Errorf("kvr_epp_served_elsewhere_total = %d, want 1", n)
	}
	f.waitIdle()
}

// 1,000 streams at once, each finishing, resetting mid-reply or before
// the answer, leave no booking and no goroutine behind.
func TestThousandStreams(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, testutil.IgnoredGoroutines()...) })
	f := startFleet(t, 2, nil)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	var refusals []string
	for i := range 1000 {
		wg.Go(func() {
			q := chat(chatBody(true, 4, longText("stream "+strconv.Itoa(i%50), 64), "hi"), uint64(i))
			q.fakeReply, q.chunks = true, 1+i%4
			switch i % 4 {
			case 1:
				q.resetAfter = 1
			case 2:
				q.resetAfter = -1
			}
			res, err := f.envoy(ctx, q)
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
			}
			mu.Lock()
			statuses[res.status]++
			if res.imm != nil && len(refusals) < 3 {
				refusals = append(refusals, string(res.imm.GetBody()))
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	f.waitIdle()
	t.Logf("statuses: %v, refusals: %q", statuses, refusals)
	if statuses[200] < 500 {
		t.Errorf("statuses %v: want most to be served", statuses)
	}
}

// Health: liveness always; readiness and the processor's service only
// while the replica is ready and the picker not draining; an unknown
// service is NotFound.
func TestHealth(t *testing.T) {
	f := startFleet(t, 1, nil)
	hc := healthpb.NewHealthClient(f.conn)
	ctx := ctxT(t)
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("%q: %v", svc, err)
		}
		return r.GetStatus()
	}
	for _, svc := range []string{HealthLiveness, HealthReadiness, ServiceName, ""} {
		if s := check(svc); s != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%q: %v, want SERVING", svc, s)
		}
	}
	f.epp.Drain()
	if s := check(HealthLiveness); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness while draining: %v", s)
	}
	for _, svc := range []string{HealthReadiness, ServiceName} {
		if s := check(svc); s != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("%q while draining: %v, want NOT_SERVING", svc, s)
		}
	}
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}
	notReady, err := New(Config{Gateway: f.g, Ready: func() bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := (health{s: notReady}).Check(ctx, &healthpb.HealthCheckRequest{Service: HealthReadiness}); r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness of a replica not caught up: %v", r.GetStatus())
	}
}

// shedRouter is a router that sheds every request (its 529).
type shedRouter struct{ gateway.Router }

func (shedRouter) Route(context.Context, *api.RouteRequest, *api.RouteResponse) error {
	return &api.Error{Code: api.CodeOverloaded, Status: api.StatusOverloaded, Message: "queue full"}
}

func (shedRouter) Workers(context.Context, string) (*api.WorkersResponse, error) {
	return &api.WorkersResponse{}, nil
}

// A router that sheds gives 429 with Retry-After, the gateway's answer.
func TestShedding429(t *testing.T) {
	g, err := gateway.New(gateway.Config{Router: shedRouter{}, Models: []string{testModel}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, g: g, http: &http.Client{}}
	if f.epp, err = New(Config{Gateway: g, Logger: testLogger()}); err != nil {
		t.Fatal(err)
	}
	f.serve()
	res := f.mustEnvoy(t, chat(chatBody(false, 4, "s", "hi"), 14))
	if res.imm == nil || res.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want an immediate 429", res.status)
	}
	var retryAfter string
	for _, h := range res.imm.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retryAfter = string(h.GetHeader().GetRawValue())
		}
	}
	if retryAfter == "" || !strings.Contains(string(res.imm.GetBody()), "router_overloaded") {
		t.Errorf("retry-after %q, body %s", retryAfter, res.imm.GetBody())
	}
}
