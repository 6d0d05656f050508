package grafana

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// The committed kvrouter.json is what the code generates: run
// `go generate ./deploy/grafana` after changing a panel.
func TestCommittedDashboardIsGenerated(t *testing.T) {
	want, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("kvrouter.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/grafana/kvrouter.json differs from the generated dashboard: run go generate ./deploy/grafana")
	}
	// And it reads back as a dashboard, every panel's query a Prometheus
	// one.
	plugins.RegisterDefaultPlugins()
	var d dashboard.Dashboard
	if err := json.Unmarshal(got, &d); err != nil {
		t.Fatalf("kvrouter.json does not decode as a dashboard: %v", err)
	}
	if d.Uid == nil || *d.Uid != UID || len(d.Panels) < 20 {
		t.Fatalf("decoded dashboard: uid %v, %d panels", d.Uid, len(d.Panels))
	}
}

// MetricNames finds the metrics of an expression and not its functions,
// labels or grouping.
func TestMetricNamesOfExpressions(t *testing.T) {
	names := MetricNames()
	for _, want := range []string{"kvr_route_requests_total", "vllm:prefix_cache_hits_total", "kvr_route_duration_seconds_bucket", "kvr_queue_depth"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s missing from %v", want, names)
		}
	}
	for _, not := range []string{"sum", "rate", "histogram_quantile", "code", "le", "by"} {
		if slices.Contains(names, not) {
			t.Errorf("%s taken for a metric in %v", not, names)
		}
	}
}
