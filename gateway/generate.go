package gateway

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/session"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// generate is one generate request's life: read -> tokenize -> route ->
// forward (one retry elsewhere before the first byte) -> relay -> free.
func (g *Gateway) generate(w http.ResponseWriter, r *http.Request, kind string) {
	t0 := time.Now()
	ctx, span := g.StartSpan(r.Context(), "gateway "+kind, r.Header)
	defer span.End()

	body, rerr := readBody(w, r, g.cfg.MaxBodyBytes)
	var rq *api.RouteRequest
	var cr *clientRequest
	var key string
	if rerr == nil {
		rq, cr, key, rerr = g.routeRequest(ctx, kind, r.Header, body)
	}
	if rerr != nil {
		g.fail(ctx, span, w, rerr)
		return
	}
	x := &exchange{g: g, w: w, r: r, kind: kind, cr: cr, body: body, rq: rq, key: key, t0: t0, span: span}
	x.run(ctx)
}

// routeRequest reads a generate body of kind and the client's headers
// (the session's) and builds the route request: the model or adapter and
// cache_salt, the session, the prompt's tokens (prompt) in the hash
// namespace of its adapter and salt, and a prefill/decode pair when the
// gateway runs a split fleet (--pd). generate and the endpoint picker
// (Prepare) both start here. key is the request key the id was made from,
// which a cancel of the queued request must carry.
func (g *Gateway) routeRequest(ctx context.Context, kind string, h http.Header, body []byte) (*api.RouteRequest, *clientRequest, string, *RequestError) {
	cr, rerr := readRequest(kind, body)
	var target modelTarget
	if rerr == nil {
		target, rerr = g.modelTarget(ctx, &cr)
	}
	sessionID, mode := h.Get(g.cfg.SessionHeader), h.Get(ModeHeader)
	if rerr == nil {
		rerr = checkSession(g.cfg.SessionHeader, sessionID, mode)
	}
	if rerr != nil {
		return nil, nil, "", rerr
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String(attrModel, cr.Model), attribute.Bool("kvr.stream", cr.Stream))
	requestAttrs(span, kind, &cr, sessionID)
	id, key := g.newRequestID()
	rq := &api.RouteRequest{V: api.APIVersion, RequestID: id, Model: cr.Model, SessionID: sessionID,
		SessionMode: mode, ExpectedOutputTokens: cr.outputTokens(), PD: g.cfg.PD != ""}
	target.apply(rq)
	if rerr = g.prompt(ctx, kind, &cr, body, rq); rerr != nil {
		return nil, nil, "", rerr
	}
	if n := len(rq.TokenIDs); n > 0 && span.IsRecording() {
		span.SetAttributes(attribute.Int(attrInputTokens, n))
	}
	namespaceBlocks(rq)
	return rq, &cr, key, nil
}

// checkSession validates the session headers: the id's length, and the
// mode, absent (the router's default) or what session.ParseMode accepts. The
// mode is forwarded as the route API's session_mode string, unchanged.
func checkSession(header, id, mode string) *RequestError {
	if len(id) > api.MaxSessionIDLen {
		return badRequest(header, "the %s header is %d bytes long, the limit is %d", header, len(id), api.MaxSessionIDLen)
	}
	if mode == "" {
		return nil
	}
	if _, err := session.ParseMode(mode); err != nil {
		return badRequest(ModeHeader, "the %s header: %v", ModeHeader, err)
	}
	return nil
}

// prompt fills rq's prompt: with Config.Tokenizer approx, the text's
// pseudo-blocks (approxPrompt); otherwise the engine's own token ids from
// its render endpoint or /tokenize on a live worker (tokenize). When the
// tokens are unknown (a field /tokenize cannot carry) or the call fails,
// the request routes on load alone with an estimate of the prompt's length
// (counted in kvr_gateway_prompt_unknown_total or
// kvr_gateway_tokenize_failures_total). An engine refusing the prompt
// (400) or a prompt longer than the engine's context refuses the request.
func (g *Gateway) prompt(ctx context.Context, kind string, cr *clientRequest, body []byte, rq *api.RouteRequest) *RequestError {
	if g.cfg.Tokenizer == TokenizerApprox {
		return g.approxPrompt(ctx, kind, cr, body, rq)
	}
	tr, err := g.tokenizeOnce(ctx, kind, cr, body)
	var se *tokenizeStatusError
	switch {
	case err == nil && tr.Unknown != "":
		g.m.promptUnknown.Add(ctx, 1, metric.WithAttributes(attribute.String("field", tr.Unknown)))
		trace.SpanFromContext(ctx).SetAttributes(attribute.String("kvr.prompt_unknown", tr.Unknown))
		rq.InputTokens = max(1, tr.Count)
		return nil
	case err == nil && tr.MaxModelLen > 0 && tr.Count+cr.outputTokens() > tr.MaxModelLen:
		e := badRequest("messages", "this model's maximum context length is %d tokens; the request has %d prompt tokens and asks for %d more",
			tr.MaxModelLen, tr.Count, cr.outputTokens())
		if kind == kindCompletion {
			e.Param = "prompt"
		}
		e.Code = "context_length_exceeded"
		return e
	case err == nil && len(tr.Tokens) > api.MaxTokens:
		return badRequest("prompt", "the prompt has %d tokens, the limit is %d", len(tr.Tokens), api.MaxTokens)
	case err == nil && len(tr.Tokens) > 0:
		// The block size lets a route API client send block hashes for a
		// prompt too long for one NATS message (docs/gateway.md, "Long
		// prompts").
		rq.TokenIDs, rq.Media, rq.BlockSize = tr.Tokens, tr.Media, g.blockSize(ctx, cr.Model)
		return nil
	case errors.As(err, &se) && se.status == http.StatusBadRequest:
		return engineRefusal(kind, se)
	}
	if err != nil && !errors.Is(err, errNoTokenize) {
		g.m.tokenizeFails.Add(ctx, 1)
		g.log.Debug("tokenize failed: routing on load alone", "model", cr.Model, "err", err)
	}
	rq.InputTokens = max(1, len(body)/4) // about 4 bytes of JSON per token
	return nil
}

// tokenizeOnce asks one live worker for the prompt's tokens, in a child
// span.
func (g *Gateway) tokenizeOnce(ctx context.Context, kind string, cr *clientRequest, body []byte) (*tokenizeReply, error) {
	e, ok := g.tokenizeTarget(ctx, cr.Model)
	if !ok {
		return nil, errors.New("no live worker to tokenize on")
	}
	ctx, span := g.tracer.Start(ctx, "tokenize", trace.WithAttributes(attribute.String("kvr.worker", e.worker)))
	defer span.End()
	engineCallAttrs(span, kind, cr.Model, e.root)
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	t0 := time.Now()
	var tr *tokenizeReply
	var err error
	if parts := mediaPartsOf(kind, cr); parts != nil {
		tr, err = g.tokenizeMedia(ctx, e.root, cr, parts)
	} else {
		tr, err = g.tokenize(ctx, e.root, kind, cr, body)
	}
	g.m.tokenize.Record(ctx, time.Since(t0).Seconds())
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	span.SetAttributes(attribute.Int("kvr.prompt_tokens", len(tr.Tokens)))
	return tr, nil
}

// fail answers the client with e and marks the span.
func (g *Gateway) fail(ctx context.Context, span trace.Span, w http.ResponseWriter, e *RequestError) {
	span.SetAttributes(attribute.Int("http.response.status_code", e.Status))
	span.SetStatus(codes.Error, e.Message)
	g.writeError(ctx, w, e)
}

// newRequestID is "<ID>-<digest of a new request key>" and the key
// (api.NewRequestID): the id the router books under, which nobody else can
// guess, and the proof of ownership a cancel of it presents.
func (g *Gateway) newRequestID() (id, key string) {
	return api.NewRequestID(g.cfg.ID + "-")
}
