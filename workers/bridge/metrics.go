package bridge

import (
	"net/http"

	"github.com/kvrouter/kvrouter/internal/buildinfo"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the bridge's own Prometheus series (kvr_bridge_*), on its
// own registry so that two bridges in one process (tests) do not collide.
type metrics struct {
	reg *prometheus.Registry

	batches, blocks, gaps, replays, replayed, duplicates, publishRejected *prometheus.CounterVec
	resyncs                                                               *prometheus.CounterVec
	decodeErrors, convertErrors                                           *prometheus.CounterVec
	badEvents, scrapeErrors, healthFailures                               prometheus.Counter
	bufferEvents                                                          *prometheus.GaugeVec
	malformed                                                             *prometheus.GaugeVec
	scrapeAge, ready, available                                           prometheus.Gauge
}

func newMetrics(withRuntime bool) *metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildinfo.Collector())
	if withRuntime {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	f := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvr_bridge_" + name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	c := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvr_bridge_" + name, Help: help})
		reg.MustRegister(c)
		return c
	}
	g := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvr_bridge_" + name, Help: help})
		reg.MustRegister(g)
		return g
	}
	gv := func(name, help string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvr_bridge_" + name, Help: help}, []string{"rank"})
		reg.MustRegister(g)
		return g
	}
	return &metrics{
		reg:             reg,
		batches:         f("batches_total", "Engine event batches handled (live and replayed).", "rank"),
		blocks:          f("blocks_total", "Blocks relayed to the event stream (stored and removed).", "rank"),
		gaps:            f("gaps_total", "Gaps seen in the engine's event sequence.", "rank"),
		replays:         f("replays_total", "Replay requests sent to the engine.", "rank"),
		replayed:        f("replayed_batches_total", "Batches received from replays.", "rank"),
		duplicates:      f("duplicate_batches_total", "Live batches skipped because a replay had applied them.", "rank"),
		publishRejected: f("publish_rejected_total", "Events the publisher refused (buffer full); routers get a resync marker.", "rank"),
		resyncs:         f("resyncs_total", "Resyncs published (KindCleared), by reason.", "rank", "reason"),
		decodeErrors:    f("decode_errors_total", "Event batches that did not decode as a whole, by cause.", "cause"),
		convertErrors:   f("convert_errors_total", "Batches with events the converter skipped, by the first cause.", "cause"),
		badEvents:       c("bad_events_total", "Single events skipped because they do not decode."),
		scrapeErrors:    c("scrape_errors_total", "Failed scrapes of the engine's /metrics."),
		healthFailures:  c("health_failures_total", "Failed GET /health of the engine."),
		bufferEvents:    gv("publish_buffer_events", "Events emitted and not yet acknowledged by the stream."),
		malformed:       gv("malformed_messages", "ZMQ messages skipped as malformed (frame count, seq frame)."),
		scrapeAge:       g("engine_scrape_age_seconds", "Age of the last good scrape of the engine's /metrics."),
		ready:           g("ready", "1 when the worker is registered."),
		available:       g("available", "1 when the worker is registered as ready (engine healthy, load fresh)."),
	}
}

// Handler serves GET /healthz (200 while the process runs), /readyz (200
// once the worker is registered and available, 503 with the reason
// otherwise) and /metrics.
func (b *Bridge) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := b.notReady(); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(b.met.reg, promhttp.HandlerOpts{}))
	return mux
}
