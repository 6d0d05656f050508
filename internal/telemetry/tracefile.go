package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// JSONSpanExporter writes finished spans as JSON lines, one span per line.
// It lets `kvrouter serve --trace-file` show traces without an OTLP
// collector (the module has no OTLP exporter dependency); production setups
// pass their own TracerProvider to the replica instead.
type JSONSpanExporter struct {
	mu  sync.Mutex
	enc *json.Encoder
	w   io.Writer
}

var _ sdktrace.SpanExporter = (*JSONSpanExporter)(nil)

// NewJSONSpanExporter writes to w; the caller closes w after Shutdown.
func NewJSONSpanExporter(w io.Writer) *JSONSpanExporter {
	return &JSONSpanExporter{enc: json.NewEncoder(w), w: w}
}

type jsonSpan struct {
	TraceID    string         `json:"trace_id"`
	SpanID     string         `json:"span_id"`
	Parent     string         `json:"parent_span_id,omitempty"`
	Name       string         `json:"name"`
	Kind       string         `json:"kind"`
	Start      time.Time      `json:"start"`
	DurationUS float64        `json:"duration_us"`
	Status     string         `json:"status,omitempty"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// ExportSpans writes spans.
func (e *JSONSpanExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range spans {
		js := jsonSpan{
			TraceID:    s.SpanContext().TraceID().String(),
			SpanID:     s.SpanContext().SpanID().String(),
			Name:       s.Name(),
			Kind:       s.SpanKind().String(),
			Start:      s.StartTime(),
			DurationUS: float64(s.EndTime().Sub(s.StartTime()).Nanoseconds()) / 1e3,
		}
		if p := s.Parent(); p.IsValid() {
			js.Parent = p.SpanID().String()
		}
		if st := s.Status(); st.Code != 0 {
			js.Status = st.Code.String() + ": " + st.Description
		}
		if attrs := s.Attributes(); len(attrs) > 0 {
			js.Attributes = make(map[string]any, len(attrs))
			for _, a := range attrs {
				js.Attributes[string(a.Key)] = a.Value.AsInterface()
			}
		}
		if err := e.enc.Encode(&js); err != nil {
			return err
		}
	}
	return nil
}

// Shutdown flushes nothing: every span is written when exported.
func (e *JSONSpanExporter) Shutdown(context.Context) error { return nil }

// TraceFile is a TracerProvider that writes sampled spans as JSON lines to
// a file (kvrouter serve --trace-file).
type TraceFile struct {
	Provider *sdktrace.TracerProvider
	f        *os.File
}

// OpenTraceFile creates path and a provider batching spans into it, sampling
// sampleRatio of new traces (parents' decisions are honoured), with
// service.name set to service.
func OpenTraceFile(path string, sampleRatio float64, service string) (*TraceFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("telemetry: trace file: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(NewJSONSpanExporter(f)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(sampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
	)
	return &TraceFile{Provider: tp, f: f}, nil
}

// Shutdown flushes the spans still batched and closes the file.
func (t *TraceFile) Shutdown(ctx context.Context) error {
	return errors.Join(t.Provider.Shutdown(ctx), t.f.Close())
}
