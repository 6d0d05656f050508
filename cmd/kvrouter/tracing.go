package main

import (
	"context"
	"log/slog"

	"github.com/kvrouter/kvrouter/internal/telemetry"
)

// traceFlags are the span destinations every role that makes spans takes:
// a JSON-lines file, an OTLP collector (the standard OTEL_EXPORTER_OTLP_*
// variables too), both or neither.
type traceFlags struct {
	file, otlpEndpoint, otlpProtocol *string
	ratio                            *float64
}

// addTraceFlags adds the trace flags; what names what a trace covers in
// --trace-sample's help ("routes", "requests").
func addTraceFlags(c *cmdFlags, what string) traceFlags {
	return traceFlags{
		file: c.str("trace-file", "", "write OpenTelemetry spans as JSON lines to this file (\"\" = none)"),
		otlpEndpoint: c.str("otlp-endpoint", "", "export OpenTelemetry spans over OTLP to this collector: host:port (plaintext) or an http(s):// URL "+
			"(\"\" = OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT if set, else none); headers, TLS and timeout from the standard OTEL_EXPORTER_OTLP_* variables"),
		otlpProtocol: c.str("otlp-protocol", "", "OTLP protocol: grpc or http/protobuf (\"\" = OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL if set, else grpc)"),
		ratio:        c.float("trace-sample", 1, "fraction of "+what+" traced when spans go anywhere (a caller's traceparent decision is honoured)"),
	}
}

// start builds the tracer provider the flags ask for (none: spans cost
// nothing) and logs where spans go.
func (f traceFlags) start(ctx context.Context, service string, log *slog.Logger) (*telemetry.Tracing, error) {
	tr, err := telemetry.StartTracing(ctx, telemetry.TraceOptions{File: *f.file, OTLPEndpoint: *f.otlpEndpoint,
		OTLPProtocol: *f.otlpProtocol, SampleRatio: *f.ratio, Service: service})
	if err != nil {
		return nil, usageError{err}
	}
	if tr.Endpoint != "" {
		log.Info("exporting spans over OTLP", "protocol", tr.Protocol, "endpoint", tr.Endpoint, "sample", *f.ratio)
	}
	return tr, nil
}
