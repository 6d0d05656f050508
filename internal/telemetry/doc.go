// Package telemetry sets up the exporters at the edge of a program: a
// Prometheus MeterProvider with its /metrics handler (prometheus.go) and a
// TracerProvider exporting spans over OTLP, gRPC or HTTP, and/or as JSON
// lines to a file (tracing.go, tracefile.go). The OTLP settings come from
// the flags and the standard OTEL_EXPORTER_OTLP_* variables; with no
// destination there is no provider, so components use the no-op one.
//
// The replica itself (router/host) and the gateway only take providers in
// their Config and link no exporter; this package is where cmd/kvrouter
// (and tests that read /metrics or receive spans) build them.
//
// Where to start reading: NewPrometheus, then StartTracing.
package telemetry
