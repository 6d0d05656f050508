package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// routeTo routes every request to one worker at endpoint and counts the
// lifecycle calls.
type routeTo struct {
	endpoint string
	mu       sync.Mutex
	frees    int
}

func (r *routeTo) Route(_ context.Context, req *api.RouteRequest, resp *api.RouteResponse) error {
	*resp = api.RouteResponse{RequestID: req.RequestID, Model: req.Model, Worker: "w", Endpoint: r.endpoint}
	return nil
}
func (*routeTo) PrefillDone(context.Context, string, *api.RouteResponse) error { return nil }
func (r *routeTo) Free(context.Context, string, *api.RouteResponse) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frees++
	return nil
}
func (*routeTo) Cancel(context.Context, string, string, string) error { return nil }
func (*routeTo) ServeWhole(context.Context, string, *api.RouteResponse) error {
	return nil
}
func (r *routeTo) Workers(context.Context, string) (*api.WorkersResponse, error) {
	return &api.WorkersResponse{Workers: []api.WorkerStatus{{Worker: "w", Model: testModel, Endpoint: r.endpoint, State: "ready"}}}, nil
}

// One span per request with children tokenize, route and upstream; the
// engine receives the upstream span's context as traceparent, and the
// client's trace is continued.
func TestTraceContextToEngine(t *testing.T) {
	var (
		mu     sync.Mutex
		parent string
	)
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/tokenize" {
			_, _ = io.WriteString(w, `{"count":2,"max_model_len":100,"tokens":[1,2]}`)
			return
		}
		mu.Lock()
		parent = r.Header.Get("traceparent")
		mu.Unlock()
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	defer eng.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	rt := &routeTo{endpoint: eng.URL + "/v1"}
	g, err := New(Config{Router: rt, Models: []string{testModel}, Logger: testLogger(), Telemetry: Telemetry{TracerProvider: tp}})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(g)
	defer gw.Close()
	const clientTrace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("traceparent", clientTrace)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(HeaderWorker) != "w#0" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	// A whole reply reaches the client before the booking is freed and
	// the request span ends: wait for it.
	spans := map[string]sdktrace.ReadOnlySpan{}
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, s := range rec.Ended() {
			spans[s.Name()] = s
		}
		_, ok := spans["gateway chat"]
		return ok
	}, func() string { return fmt.Sprintf("no request span among %v", spans) })
	root := spans["gateway chat"]
	if got := root.SpanContext().TraceID().String(); got != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("request span trace %s: the client's trace is not continued", got)
	}
	for _, name := range []string{"tokenize", "route", "upstream"} {
		s, ok := spans[name]
		if !ok || s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Fatalf("span %q missing or not a child of the request span", name)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	up := spans["upstream"].SpanContext()
	if want := "00-" + up.TraceID().String() + "-" + up.SpanID().String() + "-01"; parent != want {
		t.Fatalf("engine got traceparent %q, want %q", parent, want)
	}
	if rt.frees != 1 {
		t.Fatalf("%d frees, want 1", rt.frees)
	}
}

// refuseRetry routes the first attempt to a dead endpoint and refuses the
// retry as a Hard binding would.
type refuseRetry struct {
	routeTo
	calls int
}

func (r *refuseRetry) Route(ctx context.Context, req *api.RouteRequest, resp *api.RouteResponse) error {
	r.mu.Lock()
	r.calls++
	n := r.calls
	r.mu.Unlock()
	if n > 1 {
		return api.NewError(api.CodeBindingRejected, "session bound to w", nil)
	}
	return r.routeTo.Route(ctx, req, resp)
}

// An engine that refuses connections and a router that refuses the retry
// (a Hard session on that engine): 502 naming the engine's failure, not
// the router's 409; both bookings freed.
func TestRetryRefusedIsBadGateway(t *testing.T) {
	dead := refusingEndpoint(t)
	rt := &refuseRetry{routeTo: routeTo{endpoint: dead}}
	g, err := New(Config{Router: rt, Models: []string{testModel}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	// Two workers in the list, so that a retry is attempted.
	g.models[testModel].engines = []engine{{worker: "w", root: engineRoot(dead)}, {worker: "w2", root: engineRoot(dead)}}
	g.models[testModel].at = time.Now()
	gw := httptest.NewServer(g)
	defer gw.Close()
	resp, eb := post(t, gw.URL, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusBadGateway || eb.Error.Code != "upstream_error" || !strings.Contains(eb.Error.Message, "refused") {
		t.Fatalf("status %d %+v", resp.StatusCode, eb)
	}
	if rt.calls != 2 || rt.frees != 1 {
		t.Fatalf("%d routes, %d frees; want 2 routes (one retry) and 1 free (the routed attempt)", rt.calls, rt.frees)
	}
}
