package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kvrouter/kvrouter/internal/jsonscan"
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
// kindCompletion): by hand for the usual body (scan), through encoding/json
// for any other, which then gives the answer or the error. It never panics;
// every refusal is a *RequestError naming the field.
func readRequest(kind string, body []byte) (clientRequest, *RequestError) {
	var cr clientRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return cr, badRequest("", "the request body is empty: want a JSON object")
	}
	if !cr.scan(body) {
		cr = clientRequest{}
		if err := json.Unmarshal(body, &cr); err != nil {
			return clientRequest{}, badRequest("", "the request body is not valid JSON for this endpoint: %v", err)
		}
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

// scan reads the routing fields of body into cr, as json.Unmarshal would,
// without reflection and without copying the raw fields (they share body's
// memory, capacity cut). It reports false, cr then half filled, for a body
// it leaves to encoding/json: not one valid JSON object, or a member it
// does not take exactly as encoding/json would (a key with escapes or one
// matching a field only case-insensitively, a string with escapes, a
// number other than a plain integer where an int goes, a value of the
// wrong type). FuzzReadRequest holds it to json.Unmarshal's answers.
func (cr *clientRequest) scan(body []byte) bool {
	return jsonscan.Members(body, cr.member)
}

// member sets the field named key to the raw JSON value v.
func (cr *clientRequest) member(key, v []byte) bool {
	var raw *json.RawMessage
	switch string(key) {
	case "model":
		return plainString(v, &cr.Model)
	case "user":
		return plainString(v, &cr.User)
	case "stream":
		switch string(v) {
		case "true":
			cr.Stream = true
		case "false":
			cr.Stream = false
		case "null": // encoding/json leaves a non-pointer field as it is
		default:
			return false
		}
		return true
	case "max_tokens":
		return intPtr(v, &cr.MaxTokens)
	case "max_completion_tokens":
		return intPtr(v, &cr.MaxCompletionTokens)
	case "add_generation_prompt":
		switch string(v) {
		case "true", "false":
			b := v[0] == 't'
			cr.AddGenerationPrompt = &b
		case "null":
			cr.AddGenerationPrompt = nil
		default:
			return false
		}
		return true
	case "messages":
		raw = &cr.Messages
	case "prompt":
		raw = &cr.Prompt
	case "cache_salt":
		raw = &cr.CacheSalt
	default:
		if raw = cr.renderFields.field(key); raw == nil {
			// encoding/json matches keys case-insensitively (with
			// Unicode folding), so a near miss goes to it.
			return !nearKnownKey(key)
		}
	}
	*raw = v
	return true
}

// field is the renderFields member named key exactly, or nil.
func (f *renderFields) field(key []byte) *json.RawMessage {
	switch string(key) {
	case "tools":
		return &f.Tools
	case "tool_choice":
		return &f.ToolChoice
	case "chat_template":
		return &f.ChatTemplate
	case "chat_template_kwargs":
		return &f.ChatTemplateKwargs
	case "continue_final_message":
		return &f.ContinueFinalMessage
	case "add_special_tokens":
		return &f.AddSpecialTokens
	case "documents":
		return &f.Documents
	case "reasoning_effort":
		return &f.ReasoningEffort
	case "response_format":
		return &f.ResponseFormat
	case "truncate_prompt_tokens":
		return &f.TruncatePromptTokens
	}
	return nil
}

// knownKeys are clientRequest's JSON names, embedded structs' included
// (TestKnownKeys checks that member takes each).
var knownKeys = jsonNames(reflect.TypeFor[clientRequest]())

func jsonNames(rt reflect.Type) []string {
	var names []string
	for i := range rt.NumField() {
		f := rt.Field(i)
		if f.Anonymous {
			names = append(names, jsonNames(f.Type)...)
		} else if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag != "" {
			names = append(names, tag)
		}
	}
	return names
}

// nearKnownKey reports whether encoding/json might match key, not exactly
// one of knownKeys, to a field: ASCII case folding, or any non-ASCII byte
// (its folding maps K and S to U+212A and U+017F).
func nearKnownKey(key []byte) bool {
	for _, c := range key {
		if c >= utf8.RuneSelf {
			return true
		}
	}
	for _, k := range knownKeys {
		if len(k) == len(key) && bytes.EqualFold(key, []byte(k)) {
			return true
		}
	}
	return false
}

// plainString sets *dst to the JSON string v when it needs no decoding (no
// escapes, valid UTF-8); null leaves *dst as it is, as encoding/json does.
func plainString(v []byte, dst *string) bool {
	if string(v) == "null" {
		return true
	}
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	in := v[1 : len(v)-1]
	if bytes.IndexByte(in, '\\') >= 0 || !utf8.Valid(in) {
		return false
	}
	*dst = string(in)
	return true
}

// intPtr sets *dst to the JSON integer v (nil for null); a fraction, an
// exponent or a value out of int's range is left to encoding/json.
func intPtr(v []byte, dst **int) bool {
	if string(v) == "null" {
		*dst = nil
		return true
	}
	n, err := strconv.Atoi(string(v)) // refuses a fraction, an exponent, a string, overflow
	if err != nil {
		return false
	}
	*dst = &n
	return true
}
