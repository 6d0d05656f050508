package host

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// instrumentationName names the tracer and meter of this package.
const instrumentationName = "github.com/kvrouter/kvrouter/router/host"

// Prometheus is a MeterProvider whose metrics are served by Handler in the
// Prometheus text format. Each replica gets its own (no global registry),
// so two replicas in one process expose separate /metrics.
type Prometheus struct {
	Provider *sdkmetric.MeterProvider
	Registry *prometheus.Registry
	Handler  http.Handler
}

// NewPrometheus builds a MeterProvider exporting to a fresh Prometheus
// registry, with Go runtime and process collectors when withRuntime is set.
func NewPrometheus(withRuntime bool) (*Prometheus, error) {
	reg := prometheus.NewRegistry()
	if withRuntime {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
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

// Latency buckets in seconds: 5 µs to 10 s, for routing decisions that are
// tens of microseconds when idle and seconds when queued.
var latencyBuckets = []float64{
	5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6,
	1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 200e-3, 500e-3, 1, 2, 5, 10,
}

var ratioBuckets = []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1}

// metrics holds the replica's instruments. Attribute sets are built once so
// that recording on the hot path does not allocate.
type metrics struct {
	routeDuration   metric.Float64Histogram
	routes          metric.Int64Counter
	queueWait       metric.Float64Histogram
	overlapRatio    metric.Float64Histogram
	bindingOutcomes metric.Int64Counter
	badRequests     metric.Int64Counter
	lifecycle       metric.Int64Counter
	resyncs         metric.Int64Counter
	eventBatches    metric.Int64Counter
	snapshots       metric.Int64Counter
	bookingSync     metric.Int64Counter
	decisionSync    metric.Int64Counter

	// cached attribute options; the slices are passed with ... so that
	// recording does not allocate a variadic slice per call
	byCode    map[string]metric.MeasurementOption
	byOutcome map[string]metric.MeasurementOption
	recCode   map[string][]metric.RecordOption
	addCode   map[string][]metric.AddOption
	addOut    map[string][]metric.AddOption
	noOpts    []metric.RecordOption
	lcMu      sync.Mutex
	lcOpts    map[[2]string][]metric.AddOption
}

// route result labels
var routeCodes = []string{"ok", CodeBadRequest, CodeNotFound, CodePinConflict, CodeBindingRejected,
	CodeNoEligibleWorker, CodeNotReady, CodeShuttingDown, CodeOverloaded, CodeCanceled, CodeInternal}

var bindingOutcomes = []string{OutcomeCreated, OutcomeFresh, OutcomeRenewed, OutcomeRebound,
	OutcomeKeptOther, OutcomeRejected, OutcomeConflict}

func newMetrics(m metric.Meter) (*metrics, error) {
	var err error
	x := &metrics{byCode: map[string]metric.MeasurementOption{}, byOutcome: map[string]metric.MeasurementOption{},
		recCode: map[string][]metric.RecordOption{}, addCode: map[string][]metric.AddOption{}, addOut: map[string][]metric.AddOption{},
		lcOpts: map[[2]string][]metric.AddOption{}}
	must := func(e error) {
		if err == nil {
			err = e
		}
	}
	var e error
	x.routeDuration, e = m.Float64Histogram("kvr.route.duration", metric.WithUnit("s"),
		metric.WithDescription("Routing decision latency from request decoded to reply encoded, by result code."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	must(e)
	x.routes, e = m.Int64Counter("kvr.route.requests",
		metric.WithDescription("Route requests answered, by result code."))
	must(e)
	x.queueWait, e = m.Float64Histogram("kvr.queue.wait", metric.WithUnit("s"),
		metric.WithDescription("Time a routed request waited in the scheduler queue before admission."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	must(e)
	x.overlapRatio, e = m.Float64Histogram("kvr.route.overlap_ratio",
		metric.WithDescription("Prompt blocks already cached on the chosen worker over prompt blocks, per routed request."),
		metric.WithExplicitBucketBoundaries(ratioBuckets...))
	must(e)
	x.bindingOutcomes, e = m.Int64Counter("kvr.binding.outcomes",
		metric.WithDescription("Session binding outcomes: created, fresh, renewed, rebound, kept_other, rejected, conflict."))
	must(e)
	x.badRequests, e = m.Int64Counter("kvr.bad_requests",
		metric.WithDescription("Requests rejected as bad input, by field."))
	must(e)
	x.lifecycle, e = m.Int64Counter("kvr.lifecycle.calls",
		metric.WithDescription("Lifecycle calls (prefill_done, free, cancel) by operation and result."))
	must(e)
	x.resyncs, e = m.Int64Counter("kvr.events.resyncs",
		metric.WithDescription("Per-worker index resyncs signalled by the event subscriber, by kind (gap, new_epoch)."))
	must(e)
	x.eventBatches, e = m.Int64Counter("kvr.events.batches",
		metric.WithDescription("KV event batches applied to the prefix index."))
	must(e)
	x.snapshots, e = m.Int64Counter("kvr.index.snapshots",
		metric.WithDescription("Index snapshots written or loaded, by operation and result."))
	must(e)
	x.bookingSync, e = m.Int64Counter("kvr.booking_sync.messages",
		metric.WithDescription("Replica booking sync messages, by direction (sent, applied, dropped)."))
	must(e)
	x.decisionSync, e = m.Int64Counter("kvr.decision_sync.decisions",
		metric.WithDescription("Routing decisions shared between replicas for the predicted index, by direction (sent, applied; bad counts undecodable messages)."))
	must(e)
	for _, c := range routeCodes {
		o := metric.WithAttributeSet(attribute.NewSet(attribute.String("code", c)))
		x.byCode[c] = o
		x.recCode[c] = []metric.RecordOption{o}
		x.addCode[c] = []metric.AddOption{o}
	}
	for _, o := range bindingOutcomes {
		opt := metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o)))
		x.byOutcome[o] = opt
		x.addOut[o] = []metric.AddOption{opt}
	}
	if err == nil {
		x.touch()
	}
	return x, err
}

// touch records zero on every fixed label set, so that dashboards and
// alerts see each series from the start rather than after its first event.
func (x *metrics) touch() {
	ctx := context.Background()
	for _, c := range routeCodes {
		x.routes.Add(ctx, 0, x.byCode[c])
	}
	for _, o := range bindingOutcomes {
		x.bindingOutcomes.Add(ctx, 0, x.byOutcome[o])
	}
	for _, k := range []string{"gap", "new_epoch"} {
		x.resyncs.Add(ctx, 0, attr(attribute.String("kind", k)))
	}
	x.badRequests.Add(ctx, 0, attr(attribute.String("field", "body")))
}

func (x *metrics) codeOpt(code string) metric.MeasurementOption {
	if o, ok := x.byCode[code]; ok {
		return o
	}
	return x.byCode[CodeInternal]
}

func (x *metrics) outcome(ctx context.Context, o string) {
	if opts, ok := x.addOut[o]; ok {
		x.bindingOutcomes.Add(ctx, 1, opts...)
	}
}

// lifecycleDone counts one lifecycle call, with cached attribute sets for
// the common results.
func (x *metrics) lifecycleDone(ctx context.Context, op, result string) {
	k := [2]string{op, result}
	x.lcMu.Lock()
	opts, ok := x.lcOpts[k]
	if !ok && len(x.lcOpts) < 256 {
		opts = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("op", op), attribute.String("result", result)))}
		x.lcOpts[k] = opts
	}
	x.lcMu.Unlock()
	if opts == nil {
		opts = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("op", op), attribute.String("result", result)))}
	}
	x.lifecycle.Add(ctx, 1, opts...)
}

// routeDone records one route's latency and result without allocating.
func (x *metrics) routeDone(ctx context.Context, code string, d time.Duration) {
	rec, ok := x.recCode[code]
	if !ok {
		code = CodeInternal
		rec = x.recCode[code]
	}
	x.routeDuration.Record(ctx, d.Seconds(), rec...)
	x.routes.Add(ctx, 1, x.addCode[code]...)
}

// attr is a shorthand for metric attribute options off the hot path.
func attr(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(kv...))
}

// Telemetry bundles the providers a replica reports to. Zero values are
// valid: nil providers mean no-op, a nil propagator means W3C trace context
// plus baggage.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
}

func (t Telemetry) withDefaults() Telemetry {
	if t.TracerProvider == nil {
		t.TracerProvider = tracenoop.NewTracerProvider()
	}
	if t.MeterProvider == nil {
		t.MeterProvider = noop.NewMeterProvider()
	}
	if t.Propagator == nil {
		t.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return t
}

// isNoopTracer reports whether tp is the no-op provider (no spans at all).
func isNoopTracer(tp trace.TracerProvider) bool {
	_, ok := tp.(tracenoop.TracerProvider)
	return ok
}

// spanAt records a finished child span of ctx covering [start, end]. The
// scheduler and the bindings table report how long their phases took; the
// host turns those into spans after the fact, so neither package needs to
// know about tracing.
func spanAt(ctx context.Context, tr trace.Tracer, name string, start, end time.Time, attrs ...attribute.KeyValue) {
	_, sp := tr.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	sp.End(trace.WithTimestamp(end))
}
