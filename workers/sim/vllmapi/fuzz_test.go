package vllmapi

import (
	"encoding/json"
	"slices"
	"testing"
)

// The request decoders never panic: any body is a request or a clear
// error, and a text prompt's tokens detokenize back to its bytes.
func FuzzRequestDecoders(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hi","max_tokens":3}`, `{"prompt":["hi"]}`, `{"prompt":[1,2,3]}`, `{"prompt":[[1,2]]}`,
		`{"prompt":[-1]}`, `{"prompt":null}`, `{"messages":[{"role":"user","content":"x"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`,
		`{"messages":[{"role":"","content":1}]}`, `{`, `[]`, `{"prompt":"é\u0000"}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}],"tool_choice":"auto","documents":[{"a":"b"}],` +
			`"reasoning_effort":"low","chat_template":"t","chat_template_kwargs":{"enable_thinking":false,"documents":1},"response_format":{}}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}],"continue_final_message":true,"add_generation_prompt":false}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var cr completionRequest
		if decodeBody(body, &cr) == nil {
			if toks, err := promptTokens(cr.Prompt, false); err == nil {
				var text string
				if json.Unmarshal(cr.Prompt, &text) == nil {
					back, err := Detokenize(toks)
					if err != nil || back != text {
						t.Fatalf("prompt %q: tokens %v detokenize to %q, %v", text, toks, back, err)
					}
				}
			}
		}
		var ch chatRequest
		if decodeBody(body, &ch) == nil {
			_, _ = ch.render(&ch.chatOnlyFields, true) // never panics, whatever the fields hold
			_, _ = ch.render(nil, false)
			if msgs, err := messages(ch.Messages); err == nil {
				// The template's prefix property: dropping the last message
				// gives a prefix of the rendered chat.
				full := Tokenize(RenderChat(msgs, false))
				head := Tokenize(RenderChat(msgs[:len(msgs)-1], false))
				if !slices.Equal(full[:len(head)], head) {
					t.Fatalf("rendering %v is not prefix-stable", msgs)
				}
			}
		}
	})
}
