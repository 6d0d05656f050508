package telemetry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/kvrouter/kvrouter/internal/buildinfo"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Prometheus is a MeterProvider whose metrics are served by Handler in the
// Prometheus text format. Each replica gets its own (no global registry),
// so two replicas in one process expose separate /metrics.
type Prometheus struct {
	Provider *sdkmetric.MeterProvider
	Registry *prometheus.Registry
	Handler  http.Handler
}

// NewPrometheus builds a MeterProvider exporting to a fresh Prometheus
// registry holding kvr_build_info, with Go runtime and process collectors
// when withRuntime is set.
func NewPrometheus(withRuntime bool) (*Prometheus, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildinfo.Collector())
	if withRuntime {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	return &Prometheus{
		Provider: mp,
		Registry: reg,
		Handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}),
	}, nil
}

// Shutdown stops the provider.
func (p *Prometheus) Shutdown(ctx context.Context) error { return p.Provider.Shutdown(ctx) }
