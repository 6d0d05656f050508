// Package otlptest is an in-process OTLP trace receiver for tests: the
// official collector service (go.opentelemetry.io/proto/otlp) over gRPC,
// and the same request over HTTP (POST /v1/traces, protobuf). It keeps
// every span it receives, flattened with its service name, and the
// request headers, so a test can assert a span tree and the exporter's
// configuration.
//
// It owns no production code path; internal/telemetry builds the
// exporters it receives from. Where to start reading: StartGRPC.
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Span is one received span with its resource's service.name.
type Span struct {
	Service string
	*tracepb.Span
}

// TraceID and SpanID are the span's ids in hex, as in a traceparent.
func (s Span) TraceID() string { return hex.EncodeToString(s.Span.TraceId) }

// SpanID is the span's id in hex.
func (s Span) SpanID() string { return hex.EncodeToString(s.Span.SpanId) }

// ParentID is the parent's span id in hex ("" for a root).
func (s Span) ParentID() string { return hex.EncodeToString(s.Span.ParentSpanId) }

// Attr is the string form of attribute key ("" when absent).
func (s Span) Attr(key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return valueString(kv.Value)
		}
	}
	return ""
}

func valueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	}
	return v.String()
}

// Receiver collects what exporters send it.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	// Endpoint is where to export: host:port for gRPC, a URL for HTTP.
	Endpoint string

	mu      sync.Mutex
	spans   []Span
	headers []map[string][]string
}

// StartGRPC serves the trace service on 127.0.0.1 until the test ends.
func StartGRPC(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Endpoint: ln.Addr().String()}
	s := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(s, r)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return r
}

// StartHTTP serves POST /v1/traces (protobuf) until the test ends.
func StartHTTP(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		body, err := io.ReadAll(q.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if q.URL.Path != "/v1/traces" || err != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		r.add(&req, q.Header)
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(s.Close)
	r.Endpoint = s.URL
	return r
}

// Export is the gRPC service's one method.
func (r *Receiver) Export(ctx context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.add(req, md)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) add(req *collectortrace.ExportTraceServiceRequest, headers map[string][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.headers = append(r.headers, headers)
	for _, rs := range req.ResourceSpans {
		var service string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = valueString(kv.Value)
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				r.spans = append(r.spans, Span{Service: service, Span: sp})
			}
		}
	}
}

// Spans is every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Header is the first value of header key (lower case for gRPC metadata)
// over the export requests received, "" when none had it.
func (r *Receiver) Header(key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.headers {
		if v := h[key]; len(v) > 0 {
			return v[0]
		}
		if v := http.Header(h).Get(key); v != "" {
			return v
		}
	}
	return ""
}
