package vllmapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvrouter/kvrouter/workers/sim"
)

// scrape reads /metrics and parses it as Prometheus text.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: status %d", rec.Code)
	}
	// vLLM's names have colons, which the legacy scheme allows as well.
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v", err)
	}
	return fams
}

// value returns the value of the family's series with engine=rank.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name, rank string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("/metrics has no %s", name)
	}
	for _, m := range f.GetMetric() {
		lbl := map[string]string{}
		for _, l := range m.GetLabel() {
			lbl[l.GetName()] = l.GetValue()
		}
		if lbl["engine"] != rank || lbl["model_name"] != testModel {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("%s has no series with engine=%s model_name=%s", name, rank, testModel)
	return 0
}

// /metrics parses with expfmt, uses vLLM's names and labels, and its gauges
// agree with the engine's state mid-run; counters add up requests' usage.
func TestMetricsAgreeWithEngine(t *testing.T) {
	clk := sim.NewVirtualClock(time.Unix(1_700_000_000, 0))
	eng, err := sim.New(sim.Config{Worker: "sim-0", Model: testModel, Ranks: 2, KVBlocks: 64, BlockSize: 16, MaxSeqs: 2, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(context.Background())
	srv, err := New(Config{Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Rank 0: three requests, two run (MaxSeqs 2), one waits.
	var streams []*sim.Stream
	for _, id := range []string{"a", "b", "c"} {
		st, err := eng.Submit(ctx, sim.Request{ID: id, Tokens: Tokenize("a prompt of forty bytes, give or take it"), MaxTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if err := eng.AdvanceTo(ctx, clk.Now().Add(time.Nanosecond)); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, srv)
	for i, l := range eng.Load() {
		r := []string{"0", "1"}[i]
		if got := value(t, fams, "vllm:num_requests_running", r); got != float64(l.ActiveRequests) {
			t.Errorf("rank %s running %g, engine says %d", r, got, l.ActiveRequests)
		}
		if got := value(t, fams, "vllm:num_requests_waiting", r); got != float64(l.WaitingRequests) {
			t.Errorf("rank %s waiting %g, engine says %d", r, got, l.WaitingRequests)
		}
		if got, want := value(t, fams, "vllm:kv_cache_usage_perc", r), float64(l.KVUsedBlocks)/64; got != want {
			t.Errorf("rank %s kv usage %g, engine says %g", r, got, want)
		}
		if got := value(t, fams, "vllm:cache_config_info", r); got != 1 {
			t.Errorf("rank %s cache_config_info %g, want 1", r, got)
		}
	}
	if l := eng.Load()[0]; l.ActiveRequests != 2 || l.WaitingRequests != 1 || l.KVUsedBlocks == 0 {
		t.Fatalf("rank 0 load %+v: the test wants 2 running, 1 waiting, blocks held", l)
	}
	info := fams["vllm:cache_config_info"].GetMetric()[0]
	got := map[string]string{}
	for _, l := range info.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if got["block_size"] != "16" || got["num_gpu_blocks"] != "64" {
		t.Fatalf("cache_config_info labels %v: want block_size 16, num_gpu_blocks 64", got)
	}

	if err := eng.RunUntilIdle(ctx); err != nil {
		t.Fatal(err)
	}
	var prompt, cached, gen float64
	for _, st := range streams {
		res, _ := st.Wait(ctx)
		srv.metrics.observe(0, res)
		prompt += float64(res.PromptTokens)
		cached += float64(res.CachedTokens)
		gen += float64(res.OutputTokens)
	}
	fams = scrape(t, srv)
	for _, c := range []struct {
		name string
		want float64
	}{
		{"vllm:prompt_tokens_total", prompt},
		{"vllm:generation_tokens_total", gen},
		{"vllm:prefix_cache_queries_total", prompt},
		{"vllm:prefix_cache_hits_total", cached},
		{"vllm:time_to_first_token_seconds", 3},
		{"vllm:inter_token_latency_seconds", 3 * 7},
		{"vllm:num_requests_running", 0},
	} {
		if got := value(t, fams, c.name, "0"); got != c.want {
			t.Errorf("%s = %g, want %g", c.name, got, c.want)
		}
	}
	if cached == 0 {
		t.Fatalf("the test wants the third request to hit the prefix the first two cached")
	}
}
