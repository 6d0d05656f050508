package bridge

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvrouter/kvrouter/workers"
)

// This file is the bridge's HTTP side of the engine: GET /health and the
// /metrics scrape, read into per-rank load and the cache configuration.

// maxMetricsBytes bounds one /metrics body.
const maxMetricsBytes = 8 << 20

// metricNames are one engine format's Prometheus names.
type metricNames struct {
	running, waiting, usage string
	// vLLM: cache_config_info carries block_size and num_gpu_blocks labels.
	cacheInfo string
	// SGLang: capacity in tokens.
	capacityTokens string
	// vLLM: lora_requests_info (adapters.go).
	loraInfo string
}

var formats = map[string]metricNames{
	FormatVLLM: {running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting",
		usage: "vllm:kv_cache_usage_perc", cacheInfo: "vllm:cache_config_info", loraInfo: "vllm:lora_requests_info"},
	FormatSGLang: {running: "sglang:num_running_reqs", waiting: "sglang:num_queue_reqs",
		usage: "sglang:token_usage", capacityTokens: "sglang:max_total_num_tokens"},
}

// rankLoad is one rank's scraped gauges.
type rankLoad struct {
	running, waiting float64
	usage            float64 // 0..1
}

// scrape is one parsed /metrics page.
type scrape struct {
	at        time.Time
	ranks     map[uint32]rankLoad
	blockSize int // 0 when the engine does not say
	kvBlocks  int // per rank; 0 when the engine does not say
	capTokens int // SGLang: tokens per rank
	lora      loraInfo
}

// engineClient talks HTTP to the engine.
type engineClient struct {
	cfg   Config
	http  *http.Client
	names metricNames
}

func newEngineClient(cfg Config) *engineClient {
	return &engineClient{cfg: cfg, http: &http.Client{Timeout: 2 * time.Second}, names: formats[cfg.EngineFormat]}
}

// health reports whether GET /health answers 200.
func (e *engineClient) health(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.cfg.engineURL("/health"), nil)
	if err != nil {
		return err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return fmt.Errorf("engine %s: health: %w", e.cfg.EngineURL, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("engine %s: health: status %d", e.cfg.EngineURL, resp.StatusCode)
	}
	return nil
}

// scrape reads the engine's /metrics.
func (e *engineClient) scrape(ctx context.Context) (scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.cfg.engineURL("/metrics"), nil)
	if err != nil {
		return scrape{}, err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return scrape{}, fmt.Errorf("engine %s: metrics: %w", e.cfg.EngineURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return scrape{}, fmt.Errorf("engine %s: metrics: status %d", e.cfg.EngineURL, resp.StatusCode)
	}
	return parseMetrics(io.LimitReader(resp.Body, maxMetricsBytes), e.names, time.Now())
}

// wanted returns the lines of a Prometheus text page that belong to one of
// names (samples and their HELP and TYPE comments): an engine's page has
// hundreds of series and the bridge reads four, so parsing only those keeps
// an idle bridge's CPU low.
func wanted(r io.Reader, names []string) (io.Reader, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i+1], body[i+1:]
		} else {
			body = nil
		}
		name := line
		if bytes.HasPrefix(name, []byte("# HELP ")) || bytes.HasPrefix(name, []byte("# TYPE ")) {
			name = name[7:]
		}
		if i := bytes.IndexAny(name, "{ \t\n"); i >= 0 {
			name = name[:i]
		}
		for _, n := range names {
			if n != "" && string(name) == n {
				out.Write(line)
				break
			}
		}
	}
	return &out, nil
}

// parseMetrics reads the gauges of names from a Prometheus text page. The
// rank of a sample is its "engine" label (vLLM), else "dp_rank" (SGLang),
// else 0.
func parseMetrics(r io.Reader, names metricNames, at time.Time) (scrape, error) {
	r, err := wanted(r, []string{names.running, names.waiting, names.usage, names.cacheInfo, names.capacityTokens, names.loraInfo})
	if err != nil {
		return scrape{}, fmt.Errorf("engine metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return scrape{}, fmt.Errorf("engine metrics: %w", err)
	}
	s := scrape{at: at, ranks: map[uint32]rankLoad{}}
	each := func(name string, f func(rank uint32, m *dto.Metric, v float64)) {
		fam := fams[name]
		if fam == nil {
			return
		}
		for _, m := range fam.GetMetric() {
			v := m.GetGauge().GetValue()
			if m.GetGauge() == nil {
				v = m.GetUntyped().GetValue()
			}
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				continue
			}
			f(rankOf(m), m, v)
		}
	}
	set := func(name string, put func(*rankLoad, float64)) {
		each(name, func(rank uint32, _ *dto.Metric, v float64) {
			l := s.ranks[rank]
			put(&l, v)
			s.ranks[rank] = l
		})
	}
	set(names.running, func(l *rankLoad, v float64) { l.running = v })
	set(names.waiting, func(l *rankLoad, v float64) { l.waiting = v })
	set(names.usage, func(l *rankLoad, v float64) { l.usage = min(v, 1) })
	if names.cacheInfo != "" {
		each(names.cacheInfo, func(_ uint32, m *dto.Metric, _ float64) {
			for _, lp := range m.GetLabel() {
				n, err := strconv.Atoi(lp.GetValue())
				if err != nil || n < 1 {
					continue
				}
				switch lp.GetName() {
				case "block_size":
					s.blockSize = n
				case "num_gpu_blocks":
					s.kvBlocks = n
				}
			}
		})
	}
	if names.capacityTokens != "" {
		each(names.capacityTokens, func(_ uint32, _ *dto.Metric, v float64) { s.capTokens = int(v) })
	}
	if names.loraInfo != "" {
		s.lora = loraInfoOf(fams[names.loraInfo])
	}
	if len(s.ranks) == 0 {
		return scrape{}, fmt.Errorf("engine metrics: none of %s, %s, %s found", names.running, names.waiting, names.usage)
	}
	return s, nil
}

func rankOf(m *dto.Metric) uint32 {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == "engine" || lp.GetName() == "dp_rank" {
			if n, err := strconv.ParseUint(lp.GetValue(), 10, 32); err == nil {
				return uint32(n)
			}
		}
	}
	return 0
}

// loadReports turns a scrape into one report per rank of the worker.
func (s scrape) loadReports(model, worker string, ranks int, kvBlocks int) []workers.LoadReport {
	out := make([]workers.LoadReport, 0, ranks)
	for r := range ranks {
		l := s.ranks[uint32(r)]
		out = append(out, workers.LoadReport{
			Model: model, Worker: worker, Rank: uint32(r),
			ActiveRequests: int(l.running), WaitingRequests: int(l.waiting),
			KVUsedBlocks: int(math.Round(l.usage * float64(kvBlocks))), KVTotalBlocks: kvBlocks, At: s.at,
		})
	}
	return out
}
