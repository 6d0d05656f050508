package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL's values the Go SDK has an
// exporter for; http/json it has not).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// TraceOptions says where a program's spans go: a JSON-lines file, an OTLP
// collector, both, or nowhere.
type TraceOptions struct {
	// File is --trace-file ("" = none).
	File string
	// OTLPEndpoint is --otlp-endpoint: a URL (http:// for plaintext,
	// https:// for TLS) or host:port (plaintext). "" reads
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT;
	// with neither set, no OTLP export.
	OTLPEndpoint string
	// OTLPProtocol is --otlp-protocol, grpc or http/protobuf. "" reads
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL,
	// else grpc (vLLM's default, so one collector port serves the engines
	// and the router).
	OTLPProtocol string
	// SampleRatio is the fraction of new traces sampled; a parent's
	// decision (a client's traceparent flags) is honoured.
	SampleRatio float64
	// Service is the default service.name (OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES win).
	Service string
}

// Tracing is the tracer provider a program's components report to, with
// its exporters. Without a destination it holds no provider, so that the
// components get the no-op one and spans cost nothing.
type Tracing struct {
	provider *sdktrace.TracerProvider
	file     *os.File
	// Protocol and Endpoint say where OTLP spans go ("" when not
	// exported): for the start log line.
	Protocol, Endpoint string
}

// StartTracing builds the provider o asks for. The other OTLP settings
// (OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, _INSECURE, _TIMEOUT,
// _COMPRESSION, _CERTIFICATE) are read by the SDK's exporters themselves.
func StartTracing(ctx context.Context, o TraceOptions) (*Tracing, error) {
	t := &Tracing{}
	var opts []sdktrace.TracerProviderOption
	target, err := resolveOTLP(o.OTLPEndpoint, o.OTLPProtocol)
	if err != nil {
		return nil, err
	}
	if target.enabled {
		exp, err := newOTLPExporter(ctx, target)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
		t.Protocol, t.Endpoint = target.protocol, target.describe()
	}
	if o.File != "" {
		f, err := os.Create(o.File)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("telemetry: trace file: %w", err), shutdownExporters(ctx, opts))
		}
		t.file = f
		opts = append(opts, sdktrace.WithBatcher(NewJSONSpanExporter(f)))
	}
	if len(opts) == 0 {
		return t, nil
	}
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", o.Service)), resource.Environment())
	if err != nil {
		res = resource.NewSchemaless(attribute.String("service.name", o.Service))
	}
	opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
		sdktrace.WithResource(res))
	t.provider = sdktrace.NewTracerProvider(opts...)
	return t, nil
}

// shutdownExporters stops the exporters of a provider that was never built
// (a later step failed).
func shutdownExporters(ctx context.Context, opts []sdktrace.TracerProviderOption) error {
	if len(opts) == 0 {
		return nil
	}
	return sdktrace.NewTracerProvider(opts...).Shutdown(ctx)
}

// TracerProvider is the provider to hand the components, nil when no span
// is exported (api.Telemetry then uses the no-op one).
func (t *Tracing) TracerProvider() trace.TracerProvider {
	if t.provider == nil {
		return nil
	}
	return t.provider
}

// Enabled reports whether spans go anywhere.
func (t *Tracing) Enabled() bool { return t.provider != nil }

// Shutdown exports the spans still batched and closes the trace file.
func (t *Tracing) Shutdown(ctx context.Context) error {
	var err error
	if t.provider != nil {
		err = t.provider.Shutdown(ctx)
	}
	if t.file != nil {
		err = errors.Join(err, t.file.Close())
	}
	return err
}

// otlpTarget is where OTLP spans go: the protocol, and the endpoint URL
// from the flag ("" = the SDK reads the environment's).
type otlpTarget struct {
	enabled  bool
	protocol string
	url      string
}

// describe names the endpoint for a log line.
func (o otlpTarget) describe() string {
	if o.url != "" {
		return o.url
	}
	return firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
}

// resolveOTLP decides whether and how spans are exported over OTLP, from
// the flags and the standard variables (the signal-specific one wins).
// A flag's host:port means plaintext; a URL without a path gets
// /v1/traces over HTTP, as the generic variable does.
func resolveOTLP(endpoint, protocol string) (otlpTarget, error) {
	t := otlpTarget{protocol: protocol}
	if t.protocol == "" {
		t.protocol = firstEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if t.protocol == "" {
		t.protocol = ProtocolGRPC
	}
	if t.protocol != ProtocolGRPC && t.protocol != ProtocolHTTP {
		return t, fmt.Errorf("telemetry: OTLP protocol %q: want %s or %s", t.protocol, ProtocolGRPC, ProtocolHTTP)
	}
	if endpoint == "" {
		t.enabled = firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") != "" &&
			os.Getenv("OTEL_TRACES_EXPORTER") != "none"
		return t, nil
	}
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return t, fmt.Errorf("telemetry: OTLP endpoint %q: want host:port or an http(s):// URL", endpoint)
	}
	if t.protocol == ProtocolHTTP && (u.Path == "" || u.Path == "/") {
		u.Path = "/v1/traces"
	}
	t.enabled, t.url = true, u.String()
	return t, nil
}

// newOTLPExporter builds the exporter of t. Neither connects here: the
// first export does, so a collector that starts later still gets spans.
func newOTLPExporter(ctx context.Context, t otlpTarget) (sdktrace.SpanExporter, error) {
	var (
		exp sdktrace.SpanExporter
		err error
	)
	if t.protocol == ProtocolHTTP {
		var opts []otlptracehttp.Option
		if t.url != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(t.url))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	} else {
		var opts []otlptracegrpc.Option
		if t.url != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(t.url))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP %s exporter: %w", t.protocol, err)
	}
	return exp, nil
}

// firstEnv is the first non-empty variable of names.
func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}
