package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/internal/tokenids"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
)

// tokenizeReply is vLLM's /tokenize answer (the fields the gateway reads).
type tokenizeReply struct {
	Count       int             `json:"count"`
	MaxModelLen int             `json:"max_model_len"`
	Tokens      []uint32        `json:"-"` // parsed from RawTokens by tokenids.Parse
	RawTokens   json.RawMessage `json:"tokens"`
	// Media are the prompt's multimodal items as the router hashes them
	// (media.go); not part of vLLM's reply.
	Media []kvevents.MediaItem `json:"-"`
	// Unknown names the field that makes the engine's tokens unknown to
	// the gateway (renderFields.uncarried); Tokens is then nil.
	Unknown string `json:"-"`
}

var tokensKey = []byte(`"tokens"`)

// idsPlaceholder takes the place of the id array cutIDArray read: an empty
// array in a spelling no encoder writes, so that a caller decoding the rest
// knows the key's value is the one that was cut only when it finds exactly
// these bytes there (a nested key, or a later duplicate key, where the
// last counts, leaves something else).
var idsPlaceholder = []byte("[\t\n\t]")

// cutIDArray finds the first `key: [ids]` in data and returns the ids with
// data where that array is replaced by idsPlaceholder; ok is false when
// there is no such key followed by an array of token ids. The caller
// checks, by decoding the rest, that the array it got was the top-level
// one.
func cutIDArray(data, key []byte) (ids []uint32, rest []byte, ok bool) {
	k := bytes.Index(data, key)
	if k < 0 {
		return nil, nil, false
	}
	j := k + len(key)
	for j < len(data) && (data[j] == ' ' || data[j] == '\t' || data[j] == '\n' || data[j] == '\r') {
		j++
	}
	if j == len(data) || data[j] != ':' {
		return nil, nil, false
	}
	j++
	ids, n, err := tokenids.Parse(data[j:], make([]uint32, 0, tokenids.Capacity(data[j:], api.MaxTokens)))
	if err != nil {
		return nil, nil, false
	}
	rest = make([]byte, 0, k+len(data)-j-n+16)
	rest = append(append(append(append(rest, data[:k]...), key...), ':'), idsPlaceholder...)
	return ids, append(rest, data[j+n:]...), true
}

// decodeTokenizeReply reads a /tokenize reply. encoding/json spent most of a
// 2,048-token tokenize call scanning and decoding the id array through
// reflection (BenchmarkTTFTParts/tokenize, docs/gateway.md), so the fast path
// reads the array by hand and gives encoding/json the rest of the reply
// (with idsPlaceholder in its place); it is taken only when the reply's
// count agrees with the ids read. Anything else goes through encoding/json
// whole.
func decodeTokenizeReply(data []byte) (tokenizeReply, error) {
	var tr tokenizeReply
	if ids, rest, ok := cutIDArray(data, tokensKey); ok {
		if json.Unmarshal(rest, &tr) == nil && bytes.Equal(tr.RawTokens, idsPlaceholder) && tr.Count == len(ids) {
			tr.Tokens, tr.RawTokens = ids, nil
			return tr, nil
		}
		tr = tokenizeReply{}
	}
	if err := json.Unmarshal(data, &tr); err != nil {
		return tokenizeReply{}, fmt.Errorf("decoding the reply: %w", err)
	}
	ids, _, err := tokenids.Parse(tr.RawTokens, make([]uint32, 0, min(max(tr.Count, 0), api.MaxTokens)))
	if err != nil {
		return tokenizeReply{}, err
	}
	tr.Tokens, tr.RawTokens = ids, nil
	return tr, nil
}

// tokenizeBody is vLLM's /tokenize request: the completion form (prompt,
// add_special_tokens) or the chat form (messages and every field of it
// that shapes the prompt, as the client gave them; absent ones are left
// out, so the engine applies its defaults, which are the generate
// endpoints').
type tokenizeBody struct {
	Model                string          `json:"model"`
	Prompt               string          `json:"prompt,omitempty"`
	Messages             json.RawMessage `json:"messages,omitempty"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message,omitempty"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens,omitempty"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	ChatTemplate         json.RawMessage `json:"chat_template,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

// engineRoot is the engine's server root from its registered endpoint, its
// OpenAI base URL: "http://h:8000/v1" and "http://h:8000" both give
// "http://h:8000" (vLLM serves /tokenize at the root and the OpenAI API
// under /v1).
func engineRoot(endpoint string) string {
	e := strings.TrimRight(endpoint, "/")
	return strings.TrimSuffix(e, "/v1")
}

// promptIDs returns the token ids of a completion prompt given as ids
// ([1,2,3] or [[1,2,3]]): such a prompt needs no tokenize call.
func promptIDs(raw json.RawMessage) ([]uint32, bool) {
	t := bytes.TrimSpace(raw)
	if len(t) < 2 || t[0] != '[' {
		return nil, false
	}
	ids := make([]uint32, 0, tokenids.Capacity(t, api.MaxTokens))
	if ids, n, err := tokenids.Parse(t, ids); err == nil {
		return ids, n == len(t) && len(ids) > 0
	}
	inner := bytes.TrimLeft(t[1:], " \t\n\r") // [[ids]]: one prompt in a batch of one
	ids, n, err := tokenids.Parse(inner, ids[:0])
	if err != nil || string(bytes.TrimSpace(inner[n:])) != "]" {
		return nil, false
	}
	return ids, len(ids) > 0
}

// promptText returns a completion prompt given as one string ("..." or
// ["..."]).
func promptText(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil && len(list) == 1 {
		return list[0], true
	}
	return "", false
}

// errNoTokenize means the prompt has a shape the engine's /tokenize does not
// take (a batch of prompts): the request routes on load alone.
var errNoTokenize = fmt.Errorf("prompt shape has no single tokenization")

// tokenize returns the prompt's token ids as the engine at root computes
// them for the client's body: a completion prompt given as ids needs no
// call; otherwise the engine's render endpoint, or /tokenize when it has
// none (render.go). A reply with Unknown set has no ids: the request uses a
// field /tokenize cannot be given, and Count is only an estimate.
func (g *Gateway) tokenize(ctx context.Context, root, kind string, cr *clientRequest, body []byte) (*tokenizeReply, error) {
	ids, isIDs := []uint32(nil), false
	if kind == kindCompletion {
		ids, isIDs = promptIDs(cr.Prompt)
		if isIDs && isNull(cr.TruncatePromptTokens) {
			return &tokenizeReply{Count: len(ids), Tokens: ids}, nil
		}
		if _, isText := promptText(cr.Prompt); !isIDs && !isText {
			return nil, errNoTokenize
		}
	}
	p := g.renders.get(root)
	if now := time.Now(); p.use(now) {
		tr, err := g.render(ctx, root, kind, body)
		p.done(err, now)
		if !errors.Is(err, errNoRender) {
			return tr, err
		}
		g.log.Debug("no render endpoint: using /tokenize", "engine", root, "err", err)
	}
	return g.tokenizeFallback(ctx, root, kind, cr, isIDs, ids)
}

// tokenizeFallback is tokenize for an engine without the render endpoint:
// /tokenize with every field it has, and no prefix claimed for a request
// with a field it lacks (Unknown).
func (g *Gateway) tokenizeFallback(ctx context.Context, root, kind string, cr *clientRequest, isIDs bool, ids []uint32) (*tokenizeReply, error) {
	field := cr.uncarried(kind)
	if isIDs { // truncated ids: the engine's truncation side is unknown
		return &tokenizeReply{Count: len(ids), Unknown: field}, nil
	}
	tr, err := g.tokenizeCall(ctx, root, kind, cr)
	if err == nil && field != "" {
		tr.Tokens, tr.Unknown = nil, field
	}
	return tr, err
}

// tokenizeCall asks the engine's /tokenize for the prompt's token ids, with
// every field /tokenize has.
func (g *Gateway) tokenizeCall(ctx context.Context, root, kind string, cr *clientRequest) (*tokenizeReply, error) {
	tb := tokenizeBody{Model: cr.Model}
	if kind == kindChat {
		tb.Messages, tb.AddGenerationPrompt = cr.Messages, cr.AddGenerationPrompt
		tb.ContinueFinalMessage, tb.Tools = cr.ContinueFinalMessage, cr.Tools
		tb.ChatTemplate, tb.ChatTemplateKwargs = cr.ChatTemplate, cr.ChatTemplateKwargs
	} else {
		tb.Prompt, _ = promptText(cr.Prompt)
	}
	tb.AddSpecialTokens = cr.AddSpecialTokens
	body, err := json.Marshal(&tb)
	if err != nil {
		return nil, err
	}
	data, err := g.post(ctx, root+"/tokenize", body)
	if err != nil {
		return nil, err
	}
	tr, err := decodeTokenizeReply(data)
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", root, err)
	}
	return &tr, nil
}

// tokenizeStatusError is a /tokenize or render reply other than 200. A 400
// is the engine refusing the prompt itself (it would refuse the generate
// request too): the gateway passes it to the client instead of routing.
type tokenizeStatusError struct {
	url    string
	status int
	body   string
}

func (e *tokenizeStatusError) Error() string {
	return fmt.Sprintf("POST %s: status %d: %s", e.url, e.status, strings.TrimSpace(e.body))
}
