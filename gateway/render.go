package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/internal/tokenids"
)

// The prompt the router hashes must be the one the engine computes, and a
// chat's prompt depends on more than its messages: tool definitions, the
// template and its variables, and more (vLLM's build_chat_params). The
// gateway asks the engine, by the most exact means it has:
//
//  1. the render endpoints of newer vLLM (POST /v1/chat/completions/render,
//     /v1/completions/render), given the client's body unchanged: they
//     return the exact token ids the generate endpoint computes, every
//     field included;
//  2. /tokenize, for an engine without them (remembered per engine: one
//     failed probe, retried after renderRetry), given every field vLLM's
//     /tokenize has. A request that uses a field /tokenize lacks
//     (uncarried) is routed as a prompt of unknown tokens: on load, with
//     /tokenize's count as its length, claiming no prefix, since the
//     template may write that field anywhere, the first block included.

// renderFields are the request fields, other than messages, prompt and
// add_generation_prompt, that change the prompt the engine computes. They
// are kept as the client wrote them: /tokenize gets them unchanged and the
// engine validates them.
type renderFields struct {
	Tools                json.RawMessage `json:"tools"`
	ToolChoice           json.RawMessage `json:"tool_choice"`
	ChatTemplate         json.RawMessage `json:"chat_template"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens"`
	Documents            json.RawMessage `json:"documents"`
	ReasoningEffort      json.RawMessage `json:"reasoning_effort"`
	ResponseFormat       json.RawMessage `json:"response_format"`
	TruncatePromptTokens json.RawMessage `json:"truncate_prompt_tokens"`
}

// uncarried names the first field of the request that changes the
// engine's prompt and that vLLM's /tokenize cannot be given ("" when there
// is none): for a chat tool_choice (vLLM renders it only with a non-empty
// tools list), documents, reasoning_effort (which also sets the template's
// enable_thinking), response_format; for both kinds truncate_prompt_tokens,
// which cuts the token list.
func (f *renderFields) uncarried(kind string) string {
	if !isNull(f.TruncatePromptTokens) {
		return "truncate_prompt_tokens"
	}
	if kind != kindChat {
		return ""
	}
	switch {
	case !isNull(f.ToolChoice) && hasElements(f.Tools):
		return "tool_choice"
	case !isNull(f.Documents):
		return "documents"
	case !isNull(f.ReasoningEffort):
		return "reasoning_effort"
	case !isNull(f.ResponseFormat):
		return "response_format"
	}
	return ""
}

// hasElements reports whether raw is a JSON array with at least one
// element.
func hasElements(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 1 && t[0] == '[' && len(bytes.TrimSpace(t[1:])) > 0 && bytes.TrimSpace(t[1:])[0] != ']'
}

// renderRetry is how long an engine found without render endpoints is
// served by /tokenize before they are probed again (it may be upgraded in
// place).
const renderRetry = 5 * time.Minute

// States of an engine's render endpoints.
const (
	renderUnknown int32 = iota // not probed yet
	renderProbing              // one request is probing; the others use /tokenize
	renderFound
	renderMissing // 404, 405 or 501: served by /tokenize until renderRetry has passed
)

// renderProbe is what the gateway knows of one engine's render endpoints.
type renderProbe struct {
	state   atomic.Int32
	missing atomic.Int64 // unix nanoseconds of the last failed probe
}

// renderProbes maps an engine root to its *renderProbe.
type renderProbes struct{ m sync.Map }

func (rp *renderProbes) get(root string) *renderProbe {
	if p, ok := rp.m.Load(root); ok {
		return p.(*renderProbe)
	}
	p, _ := rp.m.LoadOrStore(root, &renderProbe{})
	return p.(*renderProbe)
}

// use reports whether this request should call the render endpoint: yes
// when it is known, and for exactly one request at a time while it is not
// (the probe).
func (p *renderProbe) use(now time.Time) bool {
	switch p.state.Load() {
	case renderFound:
		return true
	case renderUnknown:
		return p.state.CompareAndSwap(renderUnknown, renderProbing)
	case renderMissing:
		return now.Sub(time.Unix(0, p.missing.Load())) >= renderRetry && p.state.CompareAndSwap(renderMissing, renderProbing)
	}
	return false
}

// done records the outcome of a render call.
func (p *renderProbe) done(err error, now time.Time) {
	var se *tokenizeStatusError
	switch {
	case errors.Is(err, errNoRender):
		p.missing.Store(now.UnixNano())
		p.state.Store(renderMissing)
	case err == nil || errors.As(err, &se):
		p.state.Store(renderFound) // the endpoint answered
	default:
		p.state.CompareAndSwap(renderProbing, renderUnknown) // no answer: probe again
	}
}

// errNoRender is an engine without the render endpoint.
var errNoRender = errors.New("the engine has no render endpoint")

// renderPath is the render endpoint of a request kind.
func renderPath(kind string) string {
	if kind == kindChat {
		return "/v1/chat/completions/render"
	}
	return "/v1/completions/render"
}

// render asks the engine at root for the exact token ids of the client's
// body (errNoRender: the engine has no render endpoint, postRender).
func (g *Gateway) render(ctx context.Context, root, kind string, body []byte) (*tokenizeReply, error) {
	data, err := g.postRender(ctx, root, renderPath(kind), body)
	if err != nil {
		return nil, err
	}
	ids, err := decodeRenderReply(data)
	if err != nil {
		return nil, fmt.Errorf("render at %s: %w", root, err)
	}
	return &tokenizeReply{Count: len(ids), Tokens: ids}, nil
}

// postRender posts body to the engine's render endpoint path. A 404, 405
// or 501 that is not the engine refusing the model is errNoRender.
func (g *Gateway) postRender(ctx context.Context, root, path string, body []byte) ([]byte, error) {
	data, err := g.post(ctx, root+path, body)
	var se *tokenizeStatusError
	if errors.As(err, &se) {
		switch se.status {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
			// vLLM's "The model `x` does not exist." is a 404 of the
			// endpoint itself.
			if !strings.Contains(se.body, "does not exist") {
				return nil, fmt.Errorf("%w (%s: status %d)", errNoRender, root, se.status)
			}
		}
	}
	return data, err
}

// post sends body to url and returns the reply's body; a status other than
// 200 is a *tokenizeStatusError.
func (g *Gateway) post(ctx context.Context, url string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	data, err := readAll(io.LimitReader(resp.Body, 8*DefaultMaxBodyBytes), min(resp.ContentLength, 8*DefaultMaxBodyBytes))
	if err != nil {
		return nil, fmt.Errorf("POST %s: reading the reply: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &tokenizeStatusError{url: url, status: resp.StatusCode, body: string(data)}
	}
	return data, nil
}

// renderReply is the part of vLLM's GenerateRequest the gateway reads (a
// chat render answers one, a completions render a list of one per prompt).
type renderReply struct {
	TokenIDs json.RawMessage `json:"token_ids"`
	Features *struct {
		Placeholders map[string][]struct {
			Offset int `json:"offset"`
		} `json:"mm_placeholders"`
	} `json:"features"`
}

var tokenIDsKey = []byte(`"token_ids"`)

// decodeRenderReply reads the token ids of a render reply: one rendered
// request, or a list of exactly one (a batch of prompts has no single
// tokenization: errNoTokenize). The ids are read by hand, as /tokenize's.
// Placeholder tokens of media items are equal for different items (the
// engine tells them apart by extra keys the router does not hash), so the
// ids end before the first media item's placeholder: the router claims no
// block the engine hashes with media.
func decodeRenderReply(data []byte) ([]uint32, error) {
	ids, rest, ok := cutIDArray(data, tokenIDsKey)
	if !ok {
		rest = data
	}
	var one renderReply
	if t := bytes.TrimSpace(rest); len(t) > 0 && t[0] == '[' {
		var list []renderReply
		if err := json.Unmarshal(rest, &list); err != nil {
			return nil, fmt.Errorf("decoding the reply: %w", err)
		}
		if len(list) != 1 {
			return nil, errNoTokenize
		}
		one = list[0]
	} else if err := json.Unmarshal(rest, &one); err != nil {
		return nil, fmt.Errorf("decoding the reply: %w", err)
	}
	if !ok || !bytes.Equal(one.TokenIDs, idsPlaceholder) { // the cut was not the (last) top-level token_ids
		var err error
		if ids, _, err = tokenids.Parse(one.TokenIDs, nil); err != nil {
			return nil, fmt.Errorf("token_ids: %w", err)
		}
	}
	if one.Features != nil {
		for _, items := range one.Features.Placeholders {
			for _, it := range items {
				if it.Offset >= 0 && it.Offset < len(ids) {
					ids = ids[:it.Offset]
				}
			}
		}
	}
	return ids, nil
}

// engineRefusal is the client's 400 for an engine that refused to tokenize
// or render the prompt. A render endpoint checks the context length itself
// (vLLM's messages say "maximum context length"): that refusal keeps the
// code the gateway gives its own check, context_length_exceeded.
func engineRefusal(kind string, se *tokenizeStatusError) *RequestError {
	e := badRequest("", "the engine refused the prompt: %s", se.body)
	if strings.Contains(se.body, "maximum context length") {
		e.Code, e.Param = "context_length_exceeded", "messages"
		if kind == kindCompletion {
			e.Param = "prompt"
		}
	}
	return e
}
