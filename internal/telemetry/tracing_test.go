package telemetry

import (
	"context"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/otlptest"
)

// clearOTLPEnv unsets the variables the tests set, so the machine's own
// do not leak in.
func clearOTLPEnv(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
		"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME",
		"OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(k, "")
	}
}

// exportOne starts tracing with o, ends one span and shuts down (which
// exports it); it returns the span's trace id.
func exportOne(t *testing.T, o TraceOptions) string {
	t.Helper()
	tr, err := StartTracing(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Enabled() {
		t.Fatalf("options %+v: tracing off", o)
	}
	_, span := tr.TracerProvider().Tracer("test").Start(context.Background(), "one")
	id := span.SpanContext().TraceID().String()
	span.End()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown (the export): %v", err)
	}
	return id
}

// received checks that rec got exactly the span of trace id from service.
func received(t *testing.T, rec *otlptest.Receiver, id, service string) {
	t.Helper()
	spans := rec.Spans()
	if len(spans) != 1 || spans[0].TraceID() != id || spans[0].Name != "one" || spans[0].Service != service {
		t.Fatalf("received %d spans %v, want span one of trace %s from %s", len(spans), spans, id, service)
	}
}

// The standard variables alone configure the exporter: endpoint, protocol
// and headers, generic or per signal (the per-signal one wins), and
// OTEL_SERVICE_NAME names the service.
func TestOTLPFromEnvironment(t *testing.T) {
	t.Run("grpc", func(t *testing.T) {
		clearOTLPEnv(t)
		rec := otlptest.StartGRPC(t)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rec.Endpoint)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
		t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=generic")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=acme,x-other=1")
		t.Setenv("OTEL_SERVICE_NAME", "from-env")
		id := exportOne(t, TraceOptions{SampleRatio: 1, Service: "kvrouter"})
		received(t, rec, id, "from-env")
		if h := rec.Header("x-tenant"); h != "acme" {
			t.Fatalf("x-tenant header %q, want the per-signal acme", h)
		}
	})
	t.Run("http", func(t *testing.T) {
		clearOTLPEnv(t)
		rec := otlptest.StartHTTP(t)
		// The generic endpoint over HTTP gets /v1/traces appended.
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rec.Endpoint)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
		t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k")
		id := exportOne(t, TraceOptions{SampleRatio: 1, Service: "kvrouter"})
		received(t, rec, id, "kvrouter")
		if h := rec.Header("Authorization"); h != "Bearer t0k" {
			t.Fatalf("authorization header %q", h)
		}
	})
	t.Run("insecure", func(t *testing.T) {
		clearOTLPEnv(t)
		rec := otlptest.StartGRPC(t)
		// https:// means TLS unless OTEL_EXPORTER_OTLP_TRACES_INSECURE
		// says otherwise (the receiver speaks plaintext).
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://"+rec.Endpoint)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")
		id := exportOne(t, TraceOptions{SampleRatio: 1, Service: "kvrouter"})
		received(t, rec, id, "kvrouter")
	})
}

// --otlp-endpoint and --otlp-protocol win over the variables; host:port
// is plaintext.
func TestOTLPFlags(t *testing.T) {
	clearOTLPEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	rec := otlptest.StartHTTP(t)
	id := exportOne(t, TraceOptions{OTLPEndpoint: strings.TrimPrefix(rec.Endpoint, "http://"), OTLPProtocol: ProtocolHTTP, SampleRatio: 1, Service: "gw"})
	received(t, rec, id, "gw")
	g := otlptest.StartGRPC(t)
	id = exportOne(t, TraceOptions{OTLPEndpoint: g.Endpoint, SampleRatio: 1, Service: "gw"})
	received(t, g, id, "gw")
}

// No flag and no variable: no provider, so components use the no-op one.
// OTEL_TRACES_EXPORTER=none turns the variables off; bad values fail.
func TestOTLPResolve(t *testing.T) {
	clearOTLPEnv(t)
	tr, err := StartTracing(context.Background(), TraceOptions{SampleRatio: 1})
	if err != nil || tr.Enabled() || tr.TracerProvider() != nil {
		t.Fatalf("no destination: %v, enabled %v", err, tr.Enabled())
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
	if tg, err := resolveOTLP("", ""); err != nil || !tg.enabled || tg.protocol != ProtocolGRPC || tg.url != "" {
		t.Fatalf("from the variable: %+v %v", tg, err)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	if tg, _ := resolveOTLP("", ""); tg.enabled {
		t.Fatal("OTEL_TRACES_EXPORTER=none still exports")
	}
	for _, c := range []struct{ endpoint, protocol, url string }{
		{"collector:4317", "", "http://collector:4317"},
		{"https://collector:4317", "grpc", "https://collector:4317"},
		{"collector:4318", "http/protobuf", "http://collector:4318/v1/traces"},
		{"https://vendor.example/otlp/v1/traces", "http/protobuf", "https://vendor.example/otlp/v1/traces"},
	} {
		if tg, err := resolveOTLP(c.endpoint, c.protocol); err != nil || tg.url != c.url {
			t.Errorf("%s %s: %+v %v, want %s", c.endpoint, c.protocol, tg, err, c.url)
		}
	}
	for _, c := range [][2]string{{"collector:4317", "http/json"}, {"ftp://collector", ""}, {"http://", ""}} {
		if _, err := resolveOTLP(c[0], c[1]); err == nil {
			t.Errorf("%s %s: no error", c[0], c[1])
		}
	}
}
