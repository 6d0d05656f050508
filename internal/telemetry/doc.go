// Package telemetry sets up the exporters at the edge of a program: a
// Prometheus MeterProvider with its /metrics handler (prometheus.go) and a
// TracerProvider writing spans as JSON lines to a file (tracefile.go).
//
// The replica itself (router/host) only takes providers in its Config and
// links no exporter; this package is where cmd/kvrouter (and tests that
// read /metrics) build them.
//
// Where to start reading: NewPrometheus, then OpenTraceFile.
package telemetry
