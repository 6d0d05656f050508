package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
)

// tokenizeReply is vLLM's /tokenize answer (the fields the gateway reads).
type tokenizeReply struct {
	Count       int             `json:"count"`
	MaxModelLen int             `json:"max_model_len"`
	Tokens      []uint32        `json:"-"` // parsed from RawTokens by parseTokenIDs
	RawTokens   json.RawMessage `json:"tokens"`
	// Media are the prompt's multimodal items as the router hashes them
	// (media.go); not part of vLLM's reply.
	Media []kvevents.MediaItem `json:"-"`
}

// parseTokenIDs reads a JSON array of token ids at the start of raw
// (after white space) and returns them appended to dst, with the length of
// raw it read.
func parseTokenIDs(raw []byte, dst []uint32) ([]uint32, int, error) {
	i := 0
	skip := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	skip()
	if i == len(raw) || raw[i] != '[' {
		return nil, 0, fmt.Errorf("tokens: want an array of token ids")
	}
	i++
	skip()
	if i < len(raw) && raw[i] == ']' {
		return dst, i + 1, nil
	}
	for {
		skip()
		start, v := i, uint64(0)
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' && i-start < 11 {
			v = v*10 + uint64(raw[i]-'0')
			i++
		}
		if i == start || v > 1<<32-1 {
			return nil, 0, fmt.Errorf("tokens: entry %d is not a token id (0 to 2^32-1)", len(dst))
		}
		dst = append(dst, uint32(v))
		skip()
		if i < len(raw) && raw[i] == ',' {
			i++
			continue
		}
		if i < len(raw) && raw[i] == ']' {
			return dst, i + 1, nil
		}
		return nil, 0, fmt.Errorf("tokens: entry %d is not a token id (0 to 2^32-1)", len(dst))
	}
}

var tokensKey = []byte(`"tokens"`)

// decodeTokenizeReply reads a /tokenize reply. encoding/json spent most of a
// 2,048-token tokenize call scanning and decoding the id array through
// reflection (BenchmarkTTFT/tokenize, docs/gateway.md), so the fast path
// reads the array by hand and gives encoding/json the rest of the reply
// (with "tokens":null in its place); it is taken only when the reply's
// count agrees with the ids read. Anything else goes through encoding/json
// whole.
func decodeTokenizeReply(data []byte) (tokenizeReply, error) {
	var tr tokenizeReply
	if k := bytes.Index(data, tokensKey); k >= 0 {
		j := k + len(tokensKey)
		for j < len(data) && (data[j] == ' ' || data[j] == '\t' || data[j] == '\n' || data[j] == '\r') {
			j++
		}
		colon := j < len(data) && data[j] == ':'
		j++
		if ids, n, err := parseTokenIDs(data[min(j, len(data)):], nil); colon && err == nil {
			rest := make([]byte, 0, k+len(data)-j-n+16)
			rest = append(append(append(rest, data[:k]...), `"tokens":null`...), data[j+n:]...)
			// The array read must be the top-level "tokens" (not a nested
			// key, not one of duplicate keys, where the last counts).
			if json.Unmarshal(rest, &tr) == nil && isNull(tr.RawTokens) && tr.Count == len(ids) {
				tr.Tokens, tr.RawTokens = ids, nil
				return tr, nil
			}
			tr = tokenizeReply{}
		}
	}
	if err := json.Unmarshal(data, &tr); err != nil {
		return tokenizeReply{}, fmt.Errorf("decoding the reply: %w", err)
	}
	ids, _, err := parseTokenIDs(tr.RawTokens, make([]uint32, 0, min(max(tr.Count, 0), api.MaxTokens)))
	if err != nil {
		return tokenizeReply{}, err
	}
	tr.Tokens, tr.RawTokens = ids, nil
	return tr, nil
}

// tokenizeBody is vLLM's /tokenize request: prompt, or messages with
// add_generation_prompt (default true).
type tokenizeBody struct {
	Model               string          `json:"model"`
	Prompt              string          `json:"prompt,omitempty"`
	Messages            json.RawMessage `json:"messages,omitempty"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt,omitempty"`
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
	var ids []uint32
	if json.Unmarshal(t, &ids) == nil {
		return ids, len(ids) > 0
	}
	var nested [][]uint32
	if json.Unmarshal(t, &nested) == nil && len(nested) == 1 && len(nested[0]) > 0 {
		return nested[0], true
	}
	return nil, false
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

// tokenize asks the engine at root for the prompt's token ids.
func (g *Gateway) tokenize(ctx context.Context, root, kind string, cr *clientRequest) (*tokenizeReply, error) {
	tb := tokenizeBody{Model: cr.Model}
	if kind == kindChat {
		tb.Messages, tb.AddGenerationPrompt = cr.Messages, cr.AddGenerationPrompt
	} else {
		if ids, ok := promptIDs(cr.Prompt); ok {
			return &tokenizeReply{Count: len(ids), Tokens: ids}, nil
		}
		text, ok := promptText(cr.Prompt)
		if !ok {
			return nil, errNoTokenize
		}
		tb.Prompt = text
	}
	body, err := json.Marshal(&tb)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, root+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", root, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8*DefaultMaxBodyBytes))
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: reading the reply: %w", root, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &tokenizeStatusError{root: root, status: resp.StatusCode, body: string(data)}
	}
	tr, err := decodeTokenizeReply(data)
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", root, err)
	}
	return &tr, nil
}

// tokenizeStatusError is a /tokenize reply other than 200. A 400 is the
// engine refusing the prompt itself (it would refuse the generate request
// too): the gateway passes it to the client instead of routing.
type tokenizeStatusError struct {
	root   string
	status int
	body   string
}

func (e *tokenizeStatusError) Error() string {
	return fmt.Sprintf("tokenize at %s: status %d: %s", e.root, e.status, strings.TrimSpace(e.body))
}
