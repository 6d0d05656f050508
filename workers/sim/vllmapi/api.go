package vllmapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
}

type completionRequest struct {
	sampling
	Prompt json.RawMessage `json:"prompt"`
}

type chatRequest struct {
	sampling
	Messages            []chatMessage `json:"messages"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt"` // vLLM extension; default true
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              *string         `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	AddSpecialTokens    json.RawMessage `json:"add_special_tokens"` // accepted; there are no special tokens
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
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
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
// prompts are not supported (the simulator serves n = 1).
func promptTokens(raw json.RawMessage) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("prompt is required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return Tokenize(text), nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return nil, fmt.Errorf("prompt: a list of %d prompts; the simulator serves one prompt per request", len(texts))
		}
		return Tokenize(texts[0]), nil
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
// placeholder, media.go), joined with "\n" as vLLM does.
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
