package vllmapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvrouter/kvrouter/internal/tokenids"
)

// Request bodies, as vLLM's OpenAI server reads them. Unknown fields are
// ignored, as there.

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// sampling holds the fields completions and chat share.
type sampling struct {
	Model         string         `json:"model"`
	MaxTokens     *int           `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	Temperature   *float64       `json:"temperature"` // accepted; the filler does not depend on it
	N             *int           `json:"n"`
	User          string         `json:"user"`
	// SimOutputTokens is the simulator's own extension (vLLM ignores it as
	// an unknown field): the reply's length, at most max_tokens. A replay
	// sets it to a trace's output length, so that max_tokens can be what a
	// client would send while the reply keeps the trace's length.
	SimOutputTokens *int    `json:"sim_output_tokens"`
	CacheSalt       *string `json:"cache_salt"` // vLLM's prefix-cache isolation (lora.go)
	disaggFields            // kv_transfer_params (vLLM) and the bootstrap fields (SGLang): pd.go
}

type completionRequest struct {
	sampling
	Prompt           json.RawMessage `json:"prompt"`
	AddSpecialTokens *bool           `json:"add_special_tokens"` // default true, as vLLM's completions
}

// templateFields are the chat fields that change the rendered prompt and
// that both /v1/chat/completions and /tokenize's chat form read.
type templateFields struct {
	Messages             []chatMessage              `json:"messages"`
	AddGenerationPrompt  *bool                      `json:"add_generation_prompt"` // vLLM extension; default true
	ContinueFinalMessage *bool                      `json:"continue_final_message"`
	AddSpecialTokens     *bool                      `json:"add_special_tokens"` // chat default false (the template has them)
	Tools                json.RawMessage            `json:"tools"`
	ChatTemplate         *string                    `json:"chat_template"`
	ChatTemplateKwargs   map[string]json.RawMessage `json:"chat_template_kwargs"`
}

// chatOnlyFields change the rendered prompt on the chat path but are not
// fields of vLLM's /tokenize, which ignores them.
type chatOnlyFields struct {
	ToolChoice      json.RawMessage `json:"tool_choice"`
	Documents       json.RawMessage `json:"documents"`
	ReasoningEffort *string         `json:"reasoning_effort"`
	ResponseFormat  json.RawMessage `json:"response_format"`
}

type chatRequest struct {
	sampling
	templateFields
	chatOnlyFields
	MaxCompletionTokens *int `json:"max_completion_tokens"`
}

type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// tokenizeRequest is /tokenize's body: the completion form (prompt,
// add_special_tokens default true) or the chat form (templateFields,
// add_special_tokens default false).
type tokenizeRequest struct {
	Model  string  `json:"model"`
	Prompt *string `json:"prompt"`
	templateFields
}

type detokenizeRequest struct {
	Model  string   `json:"model"`
	Tokens []uint32 `json:"tokens"`
}

func (s *sampling) modelName() string          { return s.Model }
func (t *tokenizeRequest) modelName() string   { return t.Model }
func (d *detokenizeRequest) modelName() string { return d.Model }

// Replies, in vLLM's shapes.

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails promptTokenDet `json:"prompt_tokens_details"`
}

type promptTokenDet struct {
	CachedTokens int `json:"cached_tokens"`
}

type completionChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   *string   `json:"stop_reason"`
}

type completionReply struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
	// KVTransferParams is a prefill leg's (pd.go).
	KVTransferParams *kvTransferParams `json:"kv_transfer_params,omitempty"`
}

type chatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatReplyMessage struct {
	Role      string   `json:"role"`
	Content   string   `json:"content"`
	ToolCalls []string `json:"tool_calls"`
}

type chatChoice struct {
	Index        int               `json:"index"`
	Message      *chatReplyMessage `json:"message,omitempty"`
	Delta        *chatDelta        `json:"delta,omitempty"`
	Logprobs     *struct{}         `json:"logprobs"`
	FinishReason *string           `json:"finish_reason"`
	StopReason   *string           `json:"stop_reason,omitempty"`
}

type chatReply struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Created          int64             `json:"created"`
	Model            string            `json:"model"`
	Choices          []chatChoice      `json:"choices"`
	Usage            *usage            `json:"usage,omitempty"`
	KVTransferParams *kvTransferParams `json:"kv_transfer_params,omitempty"` // a prefill leg's (pd.go)
}

type tokenizeReply struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

type detokenizeReply struct {
	Prompt string `json:"prompt"`
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

// decodeBody decodes one JSON object from body; trailing data is an error.
func decodeBody(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON request body: %w", err)
	}
	if dec.More() {
		return errors.New("malformed JSON request body: data after the JSON object")
	}
	return nil
}

// promptTokens reads a completion prompt: a string, a list of one string, a
// list of token ids or a list of one list of token ids. Batches of several
// prompts are not supported (the simulator serves n = 1). A text prompt
// starts with BOSToken when bos is set; token ids are taken as they are,
// as vLLM does.
func promptTokens(raw json.RawMessage, bos bool) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("prompt is required")
	}
	// Token ids, the replay's prompts, are read by hand (internal/tokenids:
	// encoding/json spent a fifth of the replay's CPU here); anything else,
	// or an id out of range, takes the general path below and its errors.
	if ids, n, err := tokenids.Parse(raw, make([]uint32, 0, tokenids.Capacity(raw, 1<<24))); err == nil && n == len(raw) && len(ids) > 0 &&
		!slices.ContainsFunc(ids, func(id uint32) bool { return id > maxTokenID }) {
		return ids, nil
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return promptIDs(text, bos, true), nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return nil, fmt.Errorf("prompt: a list of %d prompts; the simulator serves one prompt per request", len(texts))
		}
		return promptIDs(texts[0], bos, true), nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return checkIDs(ids)
	}
	var lists [][]int64
	if json.Unmarshal(raw, &lists) == nil {
		if len(lists) != 1 {
			return nil, fmt.Errorf("prompt: a list of %d token lists; the simulator serves one prompt per request", len(lists))
		}
		return checkIDs(lists[0])
	}
	return nil, errors.New("prompt: want a string, a list of one string, a list of token ids or a list of one list of token ids")
}

func checkIDs(ids []int64) ([]uint32, error) {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id > maxTokenID {
			return nil, fmt.Errorf("prompt: token id %d at position %d is out of range (0..%d)", id, i, maxTokenID)
		}
		out[i] = uint32(id)
	}
	return out, nil
}

// messages reads chat messages: content is a string, null, or a list of
// parts of which the "text" and "image_url" ones count (an image as its
// placeholder, media.go), joined with "\n" as vLLM does; an assistant's
// tool_calls are kept as compact JSON.
func messages(in []chatMessage) ([]Message, error) {
	if len(in) == 0 {
		return nil, errors.New("messages: at least one message is required")
	}
	out := make([]Message, len(in))
	for i, m := range in {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d]: role is required", i)
		}
		content, err := messageContent(m.Content)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out[i] = Message{Role: m.Role, Content: content}
		if !isNull(m.ToolCalls) {
			calls, err := compactList(m.ToolCalls)
			if err != nil {
				return nil, fmt.Errorf("messages[%d].tool_calls: %w", i, err)
			}
			if len(calls) > 0 {
				out[i].ToolCalls = "[" + strings.Join(calls, ",") + "]"
			}
		}
	}
	return out, nil
}

func messageContent(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content: want a string or a list of content parts")
	}
	var texts []string
	for _, p := range parts {
		if t, ok := partText(p); ok {
			texts = append(texts, t)
		}
	}
	return strings.Join(texts, "\n"), nil
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// compactList returns the elements of a JSON array as compact JSON, in
// order, keys in the order given (as a template's tojson writes a parsed
// object).
func compactList(raw json.RawMessage) ([]string, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("want a list")
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = compact(it)
	}
	return out, nil
}

// compact is raw without insignificant white space (raw is valid JSON: it
// was decoded).
func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// reasoningEfforts are the values vLLM's request model accepts.
var reasoningEfforts = []string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}

// Refusals of add_generation_prompt with continue_final_message: vLLM's
// request validator when both are given true, the template library's when
// add_generation_prompt is true by default.
const (
	errBothGiven   = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
	errBothDefault = "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead."
)

// options merges the request's fields into the template's variables as
// vLLM does (build_chat_params, merge_kwargs): chat_template_kwargs first,
// then the request's own fields where set (None and "auto" do not
// override), enable_thinking from reasoning_effort when the kwargs do not
// set it. extra is nil on /tokenize, which has no such fields.
func (f *templateFields) options(extra *chatOnlyFields) (ChatOptions, error) {
	o := ChatOptions{
		AddGenerationPrompt:  f.AddGenerationPrompt == nil || *f.AddGenerationPrompt,
		ContinueFinalMessage: f.ContinueFinalMessage != nil && *f.ContinueFinalMessage,
	}
	switch {
	case o.ContinueFinalMessage && o.AddGenerationPrompt && f.AddGenerationPrompt != nil:
		return o, errors.New(errBothGiven)
	case o.ContinueFinalMessage && o.AddGenerationPrompt:
		return o, errors.New(errBothDefault)
	}
	if f.ChatTemplate != nil {
		o.ChatTemplate = *f.ChatTemplate
	}
	if !isNull(f.Tools) {
		tools, err := compactList(f.Tools)
		if err != nil {
			return o, fmt.Errorf("tools: %w", err)
		}
		o.Tools = tools
	}
	kw := f.ChatTemplateKwargs
	docs, effort, thinking := kw["documents"], kw["reasoning_effort"], kw["enable_thinking"]
	if extra != nil {
		if !isNull(extra.Documents) {
			docs = extra.Documents
		}
		if e := extra.ReasoningEffort; e != nil && *e != "auto" {
			if !slices.Contains(reasoningEfforts, *e) {
				return o, fmt.Errorf("reasoning_effort %q: want one of %v", *e, reasoningEfforts)
			}
			effort, _ = json.Marshal(*e)
			if _, set := kw["enable_thinking"]; !set {
				thinking = json.RawMessage(strconv.FormatBool(*e != "none"))
			}
		}
		if len(o.Tools) > 0 && !isNull(extra.ToolChoice) {
			o.ToolChoice = compact(extra.ToolChoice)
		}
		if !isNull(extra.ResponseFormat) {
			o.ResponseFormat = compact(extra.ResponseFormat)
		}
	}
	if !isNull(docs) {
		d, err := compactList(docs)
		if err != nil {
			return o, fmt.Errorf("documents: %w", err)
		}
		o.Documents = d
	}
	if !isNull(effort) {
		var s string
		if json.Unmarshal(effort, &s) == nil {
			o.ReasoningEffort = s
		} else {
			o.ReasoningEffort = compact(effort)
		}
	}
	o.ThinkingOff = bytes.Equal(bytes.TrimSpace(thinking), []byte("false"))
	return o, nil
}

// render reads a chat's messages and options and returns its token ids;
// extra is nil on /tokenize.
func (f *templateFields) render(extra *chatOnlyFields, bos bool) ([]uint32, error) {
	msgs, err := messages(f.Messages)
	if err != nil {
		return nil, err
	}
	o, err := f.options(extra)
	if err != nil {
		return nil, err
	}
	return promptIDs(o.Render(msgs), bos, f.AddSpecialTokens != nil && *f.AddSpecialTokens), nil
}
