package realpath

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvrouter/kvrouter/deploy/grafana"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/telemetry"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
)

// scrapeNames adds to names every metric family on the /metrics page h
// serves, a histogram's and a summary's with their _bucket, _sum and
// _count series.
func scrapeNames(t *testing.T, what string, h http.Handler, names map[string]string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("%s /metrics: %d %s", what, rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("%s /metrics: %v", what, err)
	}
	for name, f := range fams {
		names[name] = what
		switch f.GetType().String() {
		case "HISTOGRAM", "GAUGE_HISTOGRAM":
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = what, what, what
		case "SUMMARY":
			names[name+"_sum"], names[name+"_count"] = what, what
		}
	}
}

// Every metric the Grafana dashboard's queries read is one the binaries
// export: read from the live /metrics pages of a replica, a gateway, a
// bridge and a simulated engine (vLLM's names) after a few requests with
// and without a session went through the real path.
func TestDashboardQueriesNameLiveMetrics(t *testing.T) {
	repProm, err := telemetry.NewPrometheus(true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repProm.Shutdown(context.Background()) })
	gwProm, err := telemetry.NewPrometheus(true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gwProm.Shutdown(context.Background()) })
	st := startStack(t, stackOpts{engines: 1, replicas: 1, kvBlocks: 1024, lateBridges: 1, tel: host.Telemetry{MeterProvider: repProm.Provider}})
	b := st.startBridge(st.engines[0], 50) // a late scrape on a loaded machine must not make the worker unavailable
	st.waitReady(1)
	gw := st.gatewayURLWith(gateway.ClientRouter{C: api.NewClient(natstest.Connect(t, st.srv), "", nil)}, gateway.Telemetry{MeterProvider: gwProm.Provider})
	for i, session := range []string{"", "dash-1", "dash-1"} {
		headers := map[string]string{}
		if session != "" {
			headers[gateway.DefaultSessionHeader] = session
		}
		st.chatOK(gw, longText("dashboard", 300), 32, i == 2, headers) // the last streams: inter-token latency
	}
	st.waitIdle()

	names := map[string]string{}
	scrapeNames(t, "replica", repProm.Handler, names)
	scrapeNames(t, "gateway", gwProm.Handler, names)
	scrapeNames(t, "bridge", b.Handler(), names)
	eng, err := st.http.Get(st.engines[0].url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(eng.Body)
	eng.Body.Close()
	scrapeNames(t, "engine", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) }), names)

	queried := grafana.MetricNames()
	if len(queried) < 30 {
		t.Fatalf("only %d metric names in the dashboard's queries: %v", len(queried), queried)
	}
	for _, m := range queried {
		if _, ok := names[m]; !ok {
			t.Errorf("the dashboard queries %s, which no live /metrics page exports", m)
		}
	}
}
