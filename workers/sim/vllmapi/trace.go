package vllmapi

import (
	"net/http"

	"github.com/kvrouter/kvrouter/workers/sim"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The engine's span, as vLLM's: one llm_request span per generate request,
// a child of the caller's traceparent (vLLM reads traceparent and
// tracestate only), with the request's usage under the GenAI conventions'
// names.

// startSpan opens the request's span, or returns nil without a
// TracerProvider (then nothing is extracted or built).
func (s *Server) startSpan(r *http.Request, j *job) trace.Span {
	if s.cfg.TracerProvider == nil {
		return nil
	}
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	op := "text_completion"
	if j.chat {
		op = "chat"
	}
	_, span := s.cfg.TracerProvider.Tracer("github.com/kvrouter/kvrouter/workers/sim/vllmapi").Start(ctx, "llm_request",
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attribute.String("gen_ai.operation.name", op),
			attribute.String("gen_ai.request.model", j.model), attribute.String("gen_ai.response.id", j.id),
			attribute.Int("gen_ai.request.max_tokens", j.maxTokens), attribute.Int64("kvr.rank", int64(j.rank))))
	return span
}

// endSpan records the result on span (nil: none) and ends it.
func endSpan(span trace.Span, res sim.Result) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("gen_ai.usage.input_tokens", res.PromptTokens),
		attribute.Int("gen_ai.usage.output_tokens", res.OutputTokens),
		attribute.Int("gen_ai.usage.cache_read.input_tokens", res.CachedTokens),
		attribute.StringSlice("gen_ai.response.finish_reasons", []string{res.FinishReason}),
		attribute.Float64("gen_ai.response.time_to_first_chunk", res.TTFT.Seconds()))
	if res.Err != nil {
		span.SetStatus(codes.Error, res.Err.Error())
	}
	span.End()
}
