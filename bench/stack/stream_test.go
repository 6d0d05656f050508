package stack

import (
	"errors"
	"strings"
	"testing"
)

func TestReadStream(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		texts      string
		cached     int
		err        error
	}{
		{"completion", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":32,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n", "a|b|", 16, nil},
		{"chat", "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n", "hi|", 0, nil},
		{"no usage", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n", "a|", 0, ErrNoUsage},
		{"bad chunk", "data: {\"choices\":[\n\n", "", 0, ErrBadChunk},
		{"bad usage", "data: {\"usage\":{\"prompt_tokens\":\"x\"}}\n\n", "", 0, ErrBadChunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got strings.Builder
			u, err := ReadStream(strings.NewReader(tc.body), func(s string) { got.WriteString(s + "|") })
			if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if got.String() != tc.texts || u.PromptTokensDetails.CachedTokens != tc.cached {
				t.Fatalf("texts %q cached %d, want %q %d", got.String(), u.PromptTokensDetails.CachedTokens, tc.texts, tc.cached)
			}
		})
	}
}

// Any bytes give an answer or an error, never a panic.
func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":3}}\n\n")
	f.Add("data: [DONE]\n")
	f.Add("data: {\"usage\":[1]}\n")
	f.Fuzz(func(t *testing.T, body string) {
		_, _ = ReadStream(strings.NewReader(body), func(string) {})
	})
}
