package gateway

import (
	"net/url"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Span attributes named by the OpenTelemetry GenAI conventions (their last
// state in the semantic-conventions repository, all "Development") and the
// stable server.* ones beside them. The kvr.* attributes say what only a
// router knows.
const (
	attrOperation   = "gen_ai.operation.name"
	attrModel       = "gen_ai.request.model"
	attrStream      = "gen_ai.request.stream"
	attrMaxTokens   = "gen_ai.request.max_tokens"
	attrInputTokens = "gen_ai.usage.input_tokens"
	attrSession     = "gen_ai.conversation.id"
)

// genAIOperation is gen_ai.operation.name of a request kind.
func genAIOperation(kind string) string {
	if kind == kindCompletion {
		return "text_completion"
	}
	return "chat"
}

// requestAttrs marks the request span with what the client asked for,
// only when it records (a gateway without tracing builds nothing).
func requestAttrs(span trace.Span, kind string, cr *clientRequest, sessionID string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(attrOperation, genAIOperation(kind)), attribute.Bool(attrStream, cr.Stream))
	if n := cr.outputTokens(); n > 0 {
		span.SetAttributes(attribute.Int(attrMaxTokens, n))
	}
	if sessionID != "" {
		span.SetAttributes(attribute.String(attrSession, sessionID))
	}
}

// engineCallAttrs marks a call to an engine (the upstream request, the
// tokenize call) as a GenAI client call to server.address:server.port.
func engineCallAttrs(span trace.Span, kind, model, endpoint string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(attrOperation, genAIOperation(kind)), attribute.String(attrModel, model))
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return
	}
	span.SetAttributes(attribute.String("server.address", u.Hostname()))
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if p, err := strconv.Atoi(port); err == nil {
		span.SetAttributes(attribute.Int("server.port", p))
	}
}
