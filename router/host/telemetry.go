package host

import (
	"context"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// instrumentationName names the tracer and meter of this package.
const instrumentationName = "github.com/kvrouter/kvrouter/router/host"

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
	pdRoutes        metric.Int64Counter
	// unregistered counts event batches of workers not in the registry, by
	// result (held, released, dropped); unregisteredOpts are its attributes.
	unregistered     metric.Int64Counter
	unregisteredOpts [3][]metric.AddOption

	// cached attribute options; the slices are passed with ... so that
	// recording does not allocate a variadic slice per call
	byCode    map[string]metric.MeasurementOption
	byOutcome map[string]metric.MeasurementOption
	recCode   map[string][]metric.RecordOption
	addCode   map[string][]metric.AddOption
	addOut    map[string][]metric.AddOption
	lcMu      sync.Mutex
	lcOpts    map[[2]string][]metric.AddOption
}

// route result labels
var routeCodes = []string{"ok", api.CodeBadRequest, api.CodeNotFound, api.CodePinConflict, api.CodeBindingRejected,
	api.CodeNoEligibleWorker, api.CodeNotReady, api.CodeShuttingDown, api.CodeOverloaded, api.CodeCanceled, api.CodeInternal}

var bindingOutcomes = []string{api.OutcomeCreated, api.OutcomeFresh, api.OutcomeRenewed, api.OutcomeRebound,
	api.OutcomeKeptOther, api.OutcomeRejected, api.OutcomeConflict}

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
	x.pdRoutes, e = m.Int64Counter("kvr.pd.routes",
		metric.WithDescription("Routes that asked for a prefill/decode pair, by mode (split, single) and the single-worker reason (short, same_worker, no_prefill_worker)."))
	must(e)
	x.unregistered, e = m.Int64Counter("kvr.events.unregistered",
		metric.WithDescription("KV event batches of workers not in the registry, by result: held (waiting for the registration), released (applied when it came), dropped."))
	must(e)
	x.unregisteredOpts = unregisteredAttrs()
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
	for _, o := range x.unregisteredOpts {
		x.unregistered.Add(ctx, 0, o...)
	}
}

func (x *metrics) codeOpt(code string) metric.MeasurementOption {
	if o, ok := x.byCode[code]; ok {
		return o
	}
	return x.byCode[api.CodeInternal]
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
		code = api.CodeInternal
		rec = x.recCode[code]
	}
	x.routeDuration.Record(ctx, d.Seconds(), rec...)
	x.routes.Add(ctx, 1, x.addCode[code]...)
}

// countBad counts a bad_request answered to a client, by field: every
// transport's error path calls it once per answer.
func (r *Replica) countBad(ctx context.Context, e *api.Error) {
	if e.Code == api.CodeBadRequest {
		r.m.badRequests.Add(ctx, 1, attr(attribute.String("field", e.Field)))
	}
}

// attr is a shorthand for metric attribute options off the hot path.
func attr(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(kv...))
}

// Telemetry is where the replica's spans and metrics go (api.Telemetry: the
// OpenTelemetry API only; zero values are no-ops).
type Telemetry = api.Telemetry

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

// routeSpanOpts are the start options of the route span, built once.
var routeSpanOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// routeTelemetry is one route's span and result metrics. Its methods are
// called on every route; each returns at once unless the span records, so
// a replica without tracing pays nothing for them.
type routeTelemetry struct {
	r       *Replica
	ctx     context.Context // the route span's context (nil without tracing), for the reply's trace headers
	span    trace.Span
	rec     bool
	t0      time.Time
	selDone time.Time // end of the latest selection, where the binding commit starts
	// readFrom is when the bindings table was called, until the first
	// selection: the binding read (zero once recorded, or without one).
	readFrom time.Time
}

// start opens the route span (only with a real TracerProvider: the no-op
// one would still cost a context per request) and returns the context the
// route runs in.
func (t *routeTelemetry) start(ctx context.Context, r *Replica) context.Context {
	t.r, t.t0 = r, time.Now()
	if !r.tracing {
		return ctx
	}
	ctx, t.span = r.tracer.Start(ctx, "kvrouter.route", routeSpanOpts...)
	t.rec = t.span.IsRecording()
	t.ctx = ctx
	return ctx
}

// end maps err to its API error (mapError), counts the result and the
// binding refusals, and closes the span. It returns the API error, or nil.
func (t *routeTelemetry) end(ctx context.Context, err error) error {
	code := "ok"
	var e *api.Error
	if err != nil {
		e = mapError(err)
		code = e.Code
		if o := refusedOutcome(err); o != "" {
			t.r.m.outcome(ctx, o)
		}
		if t.rec {
			t.span.SetStatus(codes.Error, e.Error())
			t.span.SetAttributes(attribute.String("kvr.error.code", e.Code))
		}
	}
	t.r.m.routeDone(ctx, code, time.Since(t.t0))
	if t.span != nil {
		t.span.End()
	}
	if e == nil {
		return nil
	}
	return e
}

func (t *routeTelemetry) request(req *api.RouteRequest) {
	if !t.rec {
		return
	}
	// gen_ai.* beside kvr.*: the GenAI conventions' names for the model
	// and the conversation, so a trace backend groups the route with the
	// gateway's and the engine's spans.
	t.span.SetAttributes(attribute.String("kvr.model", req.Model), attribute.String("gen_ai.request.model", req.Model),
		attribute.String("kvr.request_id", req.RequestID))
	if req.SessionID != "" {
		t.span.SetAttributes(attribute.String("kvr.session_id", req.SessionID), attribute.String("gen_ai.conversation.id", req.SessionID))
	}
}

func (t *routeTelemetry) lookedUp(start time.Time, promptBlocks int, ov, pov *index.Overlaps) {
	if !t.rec {
		return
	}
	spanAt(t.ctx, t.r.tracer, "index.lookup", start, time.Now(),
		attribute.Int("kvr.prompt_blocks", promptBlocks), attribute.Int("kvr.matched_blocks", max(ov.Total, pov.Total)),
		attribute.Int("kvr.workers_matched", len(ov.Workers)), attribute.Int("kvr.workers_predicted", len(pov.Workers)))
}

// scheduled records the queue wait and the selection of one Schedule call
// as two child spans (the scheduler reports how long it waited).
func (t *routeTelemetry) scheduled(start time.Time, d *scheduler.Decision) {
	if !t.rec {
		return
	}
	end := time.Now()
	waitEnd := start.Add(d.Waited)
	if waitEnd.After(end) {
		waitEnd = end
	}
	if !t.readFrom.IsZero() {
		spanAt(t.ctx, t.r.tracer, "bindings.read", t.readFrom, start)
		t.readFrom = time.Time{}
	}
	spanAt(t.ctx, t.r.tracer, "scheduler.queue_wait", start, waitEnd)
	spanAt(t.ctx, t.r.tracer, "scheduler.select", waitEnd, end,
		attribute.String("kvr.policy", d.Policy), attribute.String("kvr.worker", d.Worker.String()),
		attribute.Bool("kvr.hard_fallback", d.HardFallback))
	t.selDone = end
}

// binding marks the start of the bindings table's call: the binding read
// runs from here to the first selection.
func (t *routeTelemetry) binding() {
	if t.rec {
		t.readFrom = time.Now()
	}
}

// bound records the binding commit, from the latest selection to now.
func (t *routeTelemetry) bound(res *bindings.Result) {
	if !t.rec || t.selDone.IsZero() {
		return
	}
	spanAt(t.ctx, t.r.tracer, "bindings.commit", t.selDone, time.Now(),
		attribute.String("kvr.binding.outcome", res.Outcome.String()),
		attribute.Int64("kvr.binding.revision", int64(res.Binding.Revision)),
		attribute.Int("kvr.binding.selections", res.Selections))
}

func (t *routeTelemetry) routed(d *scheduler.Decision) {
	if !t.rec {
		return
	}
	t.span.SetAttributes(attribute.String("kvr.worker", d.Worker.String()), attribute.Int("kvr.overlap_blocks", d.OverlapBlocks),
		attribute.Int64("kvr.attempt", int64(d.Fence.Attempt)))
}
