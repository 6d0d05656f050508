package gateway

import (
	"github.com/kvrouter/kvrouter/router/api"

	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

const instrumentationName = "github.com/kvrouter/kvrouter/gateway"

// Telemetry is where the gateway's spans and metrics go (api.Telemetry: the
// OpenTelemetry API only; zero values are no-ops).
type Telemetry = api.Telemetry

// metrics are the gateway's instruments (docs/gateway.md lists them).
type metrics struct {
	requests      metric.Int64Counter
	ttft          metric.Float64Histogram
	itl           metric.Float64Histogram
	tokenize      metric.Float64Histogram
	route         metric.Float64Histogram
	tokenizeFails metric.Int64Counter
	promptUnknown metric.Int64Counter
	retries       metric.Int64Counter
	upstreamErrs  metric.Int64Counter
	pdFallbacks   metric.Int64Counter
	statusOpts    map[int]metric.AddOption // kept per status so a request allocates none
}

// Phases of an upstream error (the phase attribute).
const (
	phaseConnect = "connect" // no connection, or no reply headers
	phaseStatus  = "status"  // a 5xx before the first byte
	phaseStream  = "stream"  // the body broke after the first byte
)

func newMetrics(m metric.Meter) (*metrics, error) {
	out := &metrics{statusOpts: map[int]metric.AddOption{}}
	var err error
	secs := metric.WithUnit("s")
	lat := metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
	if out.requests, err = m.Int64Counter("kvr_gateway_requests_total", metric.WithDescription("client requests answered, by HTTP status")); err != nil {
		return nil, err
	}
	if out.ttft, err = m.Float64Histogram("kvr_gateway_ttft_seconds", secs, lat, metric.WithDescription("time from the client's request to the first token sent back (streams) or the whole reply")); err != nil {
		return nil, err
	}
	if out.itl, err = m.Float64Histogram("kvr_gateway_itl_seconds", secs, lat, metric.WithDescription("time between streamed token events as the gateway forwarded them")); err != nil {
		return nil, err
	}
	if out.tokenize, err = m.Float64Histogram("kvr_gateway_tokenize_seconds", secs, lat, metric.WithDescription("engine /tokenize call latency")); err != nil {
		return nil, err
	}
	if out.route, err = m.Float64Histogram("kvr_gateway_route_seconds", secs, lat, metric.WithDescription("route call latency: the router's queue, its decision and booking, and over NATS the round trip")); err != nil {
		return nil, err
	}
	if out.tokenizeFails, err = m.Int64Counter("kvr_gateway_tokenize_failures_total", metric.WithDescription("tokenize calls that failed: the request was routed on load alone")); err != nil {
		return nil, err
	}
	if out.promptUnknown, err = m.Int64Counter("kvr_gateway_prompt_unknown_total", metric.WithDescription("requests routed on load alone because they use a field the engine's /tokenize cannot be given (the engine has no render endpoint), by field")); err != nil {
		return nil, err
	}
	if out.retries, err = m.Int64Counter("kvr_gateway_retries_total", metric.WithDescription("requests retried on another worker after an upstream failure before the first byte")); err != nil {
		return nil, err
	}
	if out.upstreamErrs, err = m.Int64Counter("kvr_gateway_upstream_errors_total", metric.WithDescription("upstream failures, by phase (connect, status, stream)")); err != nil {
		return nil, err
	}
	if out.pdFallbacks, err = m.Int64Counter("kvr_gateway_pd_fallbacks_total", metric.WithDescription("split requests whose prefill leg failed before the decode leg started: the decode worker served the whole request (pd.go)")); err != nil {
		return nil, err
	}
	for _, st := range []int{200, 400, 404, 405, 409, 413, 429, 499, 500, 502, 503, 504} {
		out.statusOpts[st] = metric.WithAttributes(attribute.String("status", strconv.Itoa(st)))
	}
	return out, nil
}

func (m *metrics) answered(ctx context.Context, status int) {
	opt, ok := m.statusOpts[status]
	if !ok {
		opt = metric.WithAttributes(attribute.String("status", strconv.Itoa(status)))
	}
	m.requests.Add(ctx, 1, opt)
}

func (m *metrics) upstreamError(ctx context.Context, phase string) {
	m.upstreamErrs.Add(ctx, 1, metric.WithAttributes(attribute.String("phase", phase)))
}
