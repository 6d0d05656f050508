package api

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Telemetry bundles the OpenTelemetry providers a component of the route
// path (a replica, a gateway) reports to: the API only, so that exporters
// stay at the edge (internal/telemetry). Zero values are valid: nil
// providers mean no-op, a nil propagator means W3C trace context plus
// baggage (what Carrier reads and writes).
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
}

// WithDefaults fills the zero values as described on Telemetry.
func (t Telemetry) WithDefaults() Telemetry {
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
