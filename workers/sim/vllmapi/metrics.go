package vllmapi

import (
	"net/http"
	"strconv"

	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// vLLM's histogram buckets (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
)

// metrics is the /metrics registry: vLLM's metric names and labels
// (model_name, and engine = the data-parallel rank). Gauges are read from
// the engine at scrape time; counters and histograms are fed by the end of
// each request, in model time (the engine's clock times the speed-up).
type metrics struct {
	reg     *prometheus.Registry
	engine  *engineCollector
	ttft    *prometheus.HistogramVec
	itl     *prometheus.HistogramVec
	prompt  *prometheus.CounterVec
	gen     *prometheus.CounterVec
	queries *prometheus.CounterVec
	hits    *prometheus.CounterVec
	success *prometheus.CounterVec
	xfer    *prometheus.CounterVec // the simulator's own: blocks pulled by KV transfers (pd.go)
	ranks   []string               // label value of each rank
	model   string
}

var labels = []string{"model_name", "engine"}

func newMetrics(s *Server) (*metrics, error) {
	m := &metrics{reg: prometheus.NewRegistry(), model: s.cfg.Model}
	ec := s.eng.Config()
	for r := range ec.Ranks {
		m.ranks = append(m.ranks, strconv.Itoa(r))
	}
	m.engine = &engineCollector{eng: s.eng, ranks: m.ranks, model: m.model}
	m.engine.describe(ec)
	m.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds (model time).", Buckets: ttftBuckets}, labels)
	m.itl = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:inter_token_latency_seconds",
		Help: "Histogram of inter-token latency in seconds (model time; each request contributes its mean gap once per gap).", Buckets: itlBuckets}, labels)
	m.prompt = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total",
		Help: "Number of prefill tokens processed."}, labels)
	m.gen = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:generation_tokens_total",
		Help: "Number of generation tokens processed."}, labels)
	m.queries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total",
		Help: "Prefix cache queries, in terms of number of queried tokens."}, labels)
	m.hits = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total",
		Help: "Prefix cache hits, in terms of number of cached tokens."}, labels)
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests."}, append([]string{"finished_reason"}, labels...))
	m.xfer = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvr_sim:kv_transfer_blocks_total",
		Help: "Prompt blocks a decode leg pulled from its prefill engine (not counting those it held)."}, labels)
	for _, c := range []prometheus.Collector{m.engine, m.ttft, m.itl, m.prompt, m.gen, m.queries, m.hits, m.success, m.xfer} {
		if err := m.reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Series exist from the start, as vLLM's do, so a scraper sees zeros.
	for _, r := range m.ranks {
		m.ttft.WithLabelValues(m.model, r)
		m.itl.WithLabelValues(m.model, r)
		for _, c := range []*prometheus.CounterVec{m.prompt, m.gen, m.queries, m.hits} {
			c.WithLabelValues(m.model, r)
		}
		m.success.WithLabelValues(sim.FinishLength, m.model, r)
	}
	return m, nil
}

// transferred counts n blocks pulled by a decode leg on rank.
func (m *metrics) transferred(rank uint32, n int) {
	m.xfer.WithLabelValues(m.model, m.ranks[rank]).Add(float64(n))
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// observe records the end of one request on rank. The prefix cache counts
// tokens, as vLLM's: every prompt token is queried, the cached ones hit.
func (m *metrics) observe(rank uint32, res sim.Result) {
	r := m.ranks[rank]
	m.prompt.WithLabelValues(m.model, r).Add(float64(res.PromptTokens))
	m.gen.WithLabelValues(m.model, r).Add(float64(res.OutputTokens))
	m.queries.WithLabelValues(m.model, r).Add(float64(res.PromptTokens))
	m.hits.WithLabelValues(m.model, r).Add(float64(res.CachedTokens))
	if res.OutputTokens > 0 {
		m.ttft.WithLabelValues(m.model, r).Observe(res.TTFT.Seconds())
	}
	itl := m.itl.WithLabelValues(m.model, r)
	for range res.OutputTokens - 1 {
		itl.Observe(res.ITL.Seconds())
	}
	if res.Err == nil {
		m.success.WithLabelValues(sim.FinishLength, m.model, r).Inc()
	}
}

// engineCollector reads the gauges from the engine at scrape time.
type engineCollector struct {
	eng   *sim.Engine
	ranks []string
	model string

	running, waiting, usage, cacheInfo *prometheus.Desc
	blockSize, numBlocks               string
}

func (c *engineCollector) describe(ec sim.Config) {
	c.running = prometheus.NewDesc("vllm:num_requests_running", "Number of requests in model execution batches.", labels, nil)
	c.waiting = prometheus.NewDesc("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, nil)
	c.usage = prometheus.NewDesc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, nil)
	c.cacheInfo = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
		append([]string{"block_size", "num_gpu_blocks"}, labels...), nil)
	c.blockSize, c.numBlocks = strconv.Itoa(ec.BlockSize), strconv.Itoa(ec.KVBlocks)
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.running
	ch <- c.waiting
	ch <- c.usage
	ch <- c.cacheInfo
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	for i, l := range c.eng.Load() {
		r := c.ranks[i]
		ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(l.ActiveRequests), c.model, r)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(l.WaitingRequests), c.model, r)
		ch <- prometheus.MustNewConstMetric(c.usage, prometheus.GaugeValue, float64(l.KVUsedBlocks)/float64(l.KVTotalBlocks), c.model, r)
		ch <- prometheus.MustNewConstMetric(c.cacheInfo, prometheus.GaugeValue, 1, c.blockSize, c.numBlocks, c.model, r)
	}
}
