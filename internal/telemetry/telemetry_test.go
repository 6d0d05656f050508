package telemetry

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A counter recorded through the provider is served by Handler.
func TestPrometheusServesMetrics(t *testing.T) {
	p, err := NewPrometheus(false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	c, err := p.Provider.Meter("test").Int64Counter("kvr.test.things")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 3)
	rec := httptest.NewRecorder()
	p.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "kvr_test_things_total 3") {
		t.Fatalf("/metrics %d:\n%s", rec.Code, rec.Body.String())
	}
}

// Spans end up in the trace file as JSON lines once the provider shuts down.
func TestTraceFileWritesSpans(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	tf, err := StartTracing(context.Background(), TraceOptions{File: path, SampleRatio: 1, Service: "kvrouter-test"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tf.TracerProvider().Tracer("test").Start(context.Background(), "kvrouter.route")
	span.End()
	if err := tf.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var js jsonSpan
	if err := json.Unmarshal(data, &js); err != nil || js.Name != "kvrouter.route" || len(js.TraceID) != 32 {
		t.Fatalf("trace file %q: %v %+v", data, err, js)
	}
	if _, err := StartTracing(context.Background(), TraceOptions{File: filepath.Join(t.TempDir(), "missing", "x.jsonl"), SampleRatio: 1, Service: "x"}); err == nil {
		t.Fatal("trace file in a missing directory: no error")
	}
}
