package realpath

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/otlptest"
	"github.com/kvrouter/kvrouter/internal/telemetry"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// startOTLP exports service's spans over OTLP gRPC to rec; the returned
// function flushes and stops the exporter.
func startOTLP(t *testing.T, rec *otlptest.Receiver, service string) (*telemetry.Tracing, func()) {
	t.Helper()
	tr, err := telemetry.StartTracing(context.Background(), telemetry.TraceOptions{OTLPEndpoint: rec.Endpoint,
		OTLPProtocol: telemetry.ProtocolGRPC, SampleRatio: 1, Service: service})
	if err != nil {
		t.Fatal(err)
	}
	var stopped bool
	stop := func() {
		if !stopped {
			stopped = true
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Errorf("%s: span export: %v", service, err)
			}
		}
	}
	t.Cleanup(stop)
	return tr, stop
}

// One chat request with a client's traceparent and a session, through a
// gateway routing over NATS to a replica, both exporting over OTLP gRPC to
// an in-process collector: the collector sees one trace, the client's, as
// one tree: the gateway's request span under the client's span, its
// tokenize, route and upstream children, the replica's kvrouter.route
// under the gateway's route span (the context crossed NATS in the
// message headers), and under it the index lookup, the binding read, the
// queue wait, the selection and the binding commit. The engine receives
// the upstream span as its traceparent and continues the trace with its
// own llm_request span, as vLLM does. Attributes carry the GenAI names.
func TestOTLPSpanTreeOfARoutedRequest(t *testing.T) {
	rec := otlptest.StartGRPC(t)
	repTr, stopRep := startOTLP(t, rec, "kvrouter")
	gwTr, stopGW := startOTLP(t, rec, "kvrouter-gateway")
	engTr, stopEng := startOTLP(t, rec, "kvrouter-sim")
	st := startStack(t, stackOpts{engines: 1, replicas: 1, kvBlocks: 1024, staleIntervals: 50, tel: host.Telemetry{TracerProvider: repTr.TracerProvider()},
		face: func(fc *vllmapi.Config) { fc.TracerProvider = engTr.TracerProvider() }})
	gtel := gateway.Telemetry{TracerProvider: gwTr.TracerProvider()}
	gw := st.gatewayURLWith(gateway.ClientRouter{C: api.NewClient(natstest.Connect(t, st.srv), "", gtel.Propagator)}, gtel)

	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	st.chatOK(gw, longText("trace me", 200), 4, false, map[string]string{
		"traceparent": "00-" + traceID + "-" + clientSpan + "-01", gateway.DefaultSessionHeader: "conv-otlp"})
	st.waitIdle() // the booking is freed: the replica's and the engine's spans have ended
	// A whole reply reaches the client before the gateway frees the
	// booking and ends its request span: wait for that span's export.
	flusher := gwTr.TracerProvider().(interface{ ForceFlush(context.Context) error })
	testutil.Eventually(t, 10*time.Second, func() bool {
		_ = flusher.ForceFlush(context.Background())
		for _, s := range rec.Spans() {
			if s.TraceID() == traceID && s.Name == "gateway chat" {
				return true
			}
		}
		return false
	}, func() string { return "the gateway's request span was never exported" })
	stopGW()
	stopRep()
	stopEng()

	spans := map[string]otlptest.Span{}
	for _, s := range rec.Spans() {
		if s.TraceID() != traceID {
			continue
		}
		if _, dup := spans[s.Name]; dup {
			t.Fatalf("span %q twice in the trace", s.Name)
		}
		spans[s.Name] = s
	}
	get := func(name, service, parent string, kind tracepb.Span_SpanKind) otlptest.Span {
		t.Helper()
		s, ok := spans[name]
		switch {
		case !ok:
			t.Fatalf("no span %q in trace %s; have %v", name, traceID, names(spans))
		case s.Service != service || s.ParentID() != parent || s.Kind != kind:
			t.Fatalf("span %q: service %q parent %s kind %v, want %q %s %v", name, s.Service, s.ParentID(), s.Kind, service, parent, kind)
		}
		return s
	}
	t.Logf("trace %s: %v", traceID, names(spans))
	internal := tracepb.Span_SPAN_KIND_INTERNAL
	root := get("gateway chat", "kvrouter-gateway", clientSpan, tracepb.Span_SPAN_KIND_SERVER)
	tok := get("tokenize", "kvrouter-gateway", root.SpanID(), internal)
	route := get("route", "kvrouter-gateway", root.SpanID(), internal)
	up := get("upstream", "kvrouter-gateway", root.SpanID(), tracepb.Span_SPAN_KIND_CLIENT)
	rr := get("kvrouter.route", "kvrouter", route.SpanID(), tracepb.Span_SPAN_KIND_SERVER)
	llm := get("llm_request", "kvrouter-sim", up.SpanID(), tracepb.Span_SPAN_KIND_SERVER)
	for _, name := range []string{"index.lookup", "bindings.read", "scheduler.queue_wait", "scheduler.select", "bindings.commit"} {
		get(name, "kvrouter", rr.SpanID(), internal)
	}
	// The route's phases in order: read the binding, wait, select, commit.
	order := []string{"bindings.read", "scheduler.queue_wait", "scheduler.select", "bindings.commit"}
	for i := 1; i < len(order); i++ {
		if a, b := spans[order[i-1]], spans[order[i]]; a.EndTimeUnixNano > b.StartTimeUnixNano {
			t.Errorf("%s ends after %s starts", order[i-1], order[i])
		}
	}

	eng, _ := url.Parse(st.engines[0].url)
	attrs := []struct {
		s          otlptest.Span
		key, value string
	}{
		{root, "gen_ai.operation.name", "chat"},
		{root, "gen_ai.request.model", testModel},
		{root, "gen_ai.conversation.id", "conv-otlp"},
		{root, "gen_ai.request.max_tokens", "4"},
		{up, "gen_ai.operation.name", "chat"},
		{up, "gen_ai.request.model", testModel},
		{up, "server.address", eng.Hostname()},
		{up, "server.port", eng.Port()},
		{up, "http.response.status_code", "200"},
		{tok, "server.address", eng.Hostname()},
		{route, "kvr.worker", "e0#0"},
		{rr, "gen_ai.request.model", testModel},
		{rr, "gen_ai.conversation.id", "conv-otlp"},
		{rr, "kvr.worker", "e0#0"},
		{spans["bindings.commit"], "kvr.binding.outcome", "created"},
		{spans["scheduler.select"], "kvr.worker", "e0#0"},
		{llm, "gen_ai.request.model", testModel},
		{llm, "gen_ai.usage.output_tokens", "4"},
		{llm, "gen_ai.usage.input_tokens", root.Attr("gen_ai.usage.input_tokens")},
	}
	for _, a := range attrs {
		if got := a.s.Attr(a.key); got != a.value {
			t.Errorf("span %q: %s = %q, want %q", a.s.Name, a.key, got, a.value)
		}
	}
	if n := root.Attr("gen_ai.usage.input_tokens"); n == "" || n == "0" {
		t.Errorf("request span: gen_ai.usage.input_tokens = %q", n)
	}
	if tp := st.engines[0].traceparent.Load(); tp == nil || *tp != "00-"+traceID+"-"+up.SpanID()+"-01" {
		t.Errorf("engine got traceparent %v, want the upstream span %s", tp, up.SpanID())
	}
}

// chatOK posts one chat message to the gateway at gw with headers and
// fails the test unless the answer is a 200.
func (st *stack) chatOK(gw, content string, maxTokens int, stream bool, headers map[string]string) {
	st.t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":%q}]}`, testModel, maxTokens, stream, content)
	req, _ := http.NewRequest(http.MethodPost, gw+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := st.http.Do(req)
	if err != nil {
		st.t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		st.t.Fatalf("chat %s: status %d: %s", headers, resp.StatusCode, out)
	}
}

// names lists the spans' names, for a failure message.
func names(spans map[string]otlptest.Span) []string {
	out := make([]string, 0, len(spans))
	for n := range spans {
		out = append(out, n)
	}
	return out
}
