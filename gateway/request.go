package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Kinds of generate request, by path.
const (
	kindChat       = "chat"       // POST /v1/chat/completions
	kindCompletion = "completion" // POST /v1/completions
)

// Limits of what the request reader accepts.
const (
	// DefaultMaxBodyBytes bounds a client's request body (larger: 413).
	DefaultMaxBodyBytes = 32 << 20
	maxModelLen         = 256 // bytes of "model", as the route API's limit
)

// clientRequest is what routing needs of a client's body; the body itself
// is forwarded to the engine unchanged.
type clientRequest struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	renderFields                        // the other fields that shape the prompt (render.go)
	Stream              bool            `json:"stream"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	User                string          `json:"user"`
	// AddGenerationPrompt is passed on to the engine's /tokenize so that
	// the routed tokens are the ones the engine will compute.
	AddGenerationPrompt *bool `json:"add_generation_prompt"`
	// CacheSalt is vLLM's cache_salt, routed on as the engine hashes it
	// (adapters.go).
	CacheSalt json.RawMessage `json:"cache_salt"`
	// body is the client's whole body (what a render endpoint takes).
	body []byte
}

// RequestError is a client request the gateway refuses: Status is the HTTP
// status, Param the offending field ("" for the whole body), Code OpenAI's
// error code.
type RequestError struct {
	Status  int
	Code    string
	Param   string
	Message string
}

func (e *RequestError) Error() string {
	if e.Param == "" {
		return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("%d %s (%s): %s", e.Status, e.Code, e.Param, e.Message)
}

func badRequest(param, format string, args ...any) *RequestError {
	return &RequestError{Status: 400, Code: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// readRequest reads the routing fields of a body of kind (kindChat or
// kindCompletion). It never panics; every refusal is a *RequestError
// naming the field.
func readRequest(kind string, body []byte) (clientRequest, *RequestError) {
	var cr clientRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return cr, badRequest("", "the request body is empty: want a JSON object")
	}
	if err := json.Unmarshal(body, &cr); err != nil {
		return clientRequest{}, badRequest("", "the request body is not valid JSON for this endpoint: %v", err)
	}
	cr.body = body
	switch {
	case cr.Model == "":
		return cr, badRequest("model", "model is required")
	case len(cr.Model) > maxModelLen:
		return cr, badRequest("model", "model is %d bytes long, the limit is %d", len(cr.Model), maxModelLen)
	case cr.MaxTokens != nil && *cr.MaxTokens < 0:
		return cr, badRequest("max_tokens", "max_tokens must not be negative")
	case cr.MaxCompletionTokens != nil && *cr.MaxCompletionTokens < 0:
		return cr, badRequest("max_completion_tokens", "max_completion_tokens must not be negative")
	}
	switch kind {
	case kindChat:
		if !isJSONArray(cr.Messages) {
			return cr, badRequest("messages", "messages is required: a list of messages")
		}
	default:
		if isNull(cr.Prompt) {
			return cr, badRequest("prompt", "prompt is required")
		}
	}
	return cr, nil
}

// outputTokens is the reply length the request asks for (0 = unknown):
// max_completion_tokens wins over max_tokens, as in OpenAI's API.
func (cr *clientRequest) outputTokens() int {
	switch {
	case cr.MaxCompletionTokens != nil:
		return *cr.MaxCompletionTokens
	case cr.MaxTokens != nil:
		return *cr.MaxTokens
	}
	return 0
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

func isJSONArray(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '['
}
