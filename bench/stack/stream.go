package stack

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Usage is an OpenAI reply's usage, with vLLM's cached-token count.
type Usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// Stream errors: a chunk that is not JSON, and a stream without usage
// (cut, or sent without stream_options.include_usage).
var (
	ErrBadChunk = errors.New("stack: bad stream chunk")
	ErrNoUsage  = errors.New("stack: the stream ended without usage")
)

// ReadStream reads an OpenAI streaming reply (server-sent events of chat
// or completion chunks) to its end as an OpenAI SDK does: onChoice is
// called with every choice's text (a completion's text or a chat delta's
// content, possibly empty) in order, and the usage of the final chunk is
// returned.
func ReadStream(body io.Reader, onChoice func(text string)) (Usage, error) {
	var usage Usage
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return usage, fmt.Errorf("%w: %.80q: %w", ErrBadChunk, data, err)
		}
		for _, c := range chunk.Choices {
			onChoice(c.Text + c.Delta.Content)
		}
		if len(chunk.Usage) > 0 && string(chunk.Usage) != "null" {
			if err := json.Unmarshal(chunk.Usage, &usage); err != nil {
				return usage, fmt.Errorf("%w: usage: %w", ErrBadChunk, err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return usage, fmt.Errorf("stack: stream cut: %w", err)
	}
	if usage.PromptTokens == 0 {
		return usage, ErrNoUsage
	}
	return usage, nil
}
