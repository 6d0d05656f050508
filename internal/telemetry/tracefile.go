package telemetry

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// JSONSpanExporter writes finished spans as JSON lines, one span per line.
// It lets `--trace-file` show traces without an OTLP collector
// (StartTracing); --otlp-endpoint sends them to one.
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
