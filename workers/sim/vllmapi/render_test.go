package vllmapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// withBOS gives the test server a BOS token.
func withBOS(c *Config) { c.BOS = true }

// renderIDs posts body to a render endpoint and returns the token ids.
func renderIDs(t *testing.T, hs *httptest.Server, path, body string) []uint32 {
	t.Helper()
	code, out := post(t, hs, path, body)
	if code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", path, body, code, out)
	}
	var one renderedRequest
	if strings.HasSuffix(path, "/completions/render") && !strings.Contains(path, "chat") {
		var list []renderedRequest
		if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 {
			t.Fatalf("%s reply %s: want a list of one rendered request (%v)", path, out, err)
		}
		one = list[0]
	} else if err := json.Unmarshal([]byte(out), &one); err != nil {
		t.Fatalf("%s reply %s: %v", path, out, err)
	}
	if one.RequestID == "" || one.Features != nil || one.SamplingParams.MaxTokens < 1 {
		t.Fatalf("%s reply %s: want a request id, features null and sampling_params.max_tokens", path, out)
	}
	return one.TokenIDs
}

// tokenizeIDs posts body to /tokenize and returns its tokens.
func tokenizeIDs(t *testing.T, hs *httptest.Server, body string) []uint32 {
	t.Helper()
	return tokenizeReplyOf(t, hs, body).Tokens
}

// tokenizeReplyOf posts body to /tokenize and returns the reply.
func tokenizeReplyOf(t *testing.T, hs *httptest.Server, body string) tokenizeReply {
	t.Helper()
	code, out := post(t, hs, "/tokenize", body)
	if code != http.StatusOK {
		t.Fatalf("/tokenize %s: %d %s", body, code, out)
	}
	var r tokenizeReply
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("/tokenize reply %s: %v", out, err)
	}
	return r
}

// promptTokensOf posts body to a generate endpoint and returns its usage's
// prompt_tokens.
func promptTokensOf(t *testing.T, hs *httptest.Server, path, body string) int {
	t.Helper()
	code, out := post(t, hs, path, body)
	if code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", path, body, code, out)
	}
	var r struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%s reply %s: %v", path, out, err)
	}
	return r.Usage.PromptTokens
}

// Two tool definitions change the prompt the engine computes: the same
// messages give more prompt_tokens with them (through the official client),
// and the tokens differ from the first block on, as the definitions render
// at the start.
func TestToolsChangePromptTokens(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 0)
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are an agent."), openai.UserMessage("Weather in Paris?")}
	tools := []openai.ChatCompletionToolUnionParam{
		openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Description: openai.String("Current weather"),
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}),
		openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "search", Parameters: shared.FunctionParameters{"type": "object"}}),
	}
	ctx := context.Background()
	plain, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, MaxTokens: openai.Int(2)})
	if err != nil {
		t.Fatal(err)
	}
	withTools, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, Tools: tools, MaxTokens: openai.Int(2)})
	if err != nil {
		t.Fatal(err)
	}
	if withTools.Usage.PromptTokens <= plain.Usage.PromptTokens+64 {
		t.Fatalf("prompt_tokens %d with two tool definitions, %d without: the tools did not render", withTools.Usage.PromptTokens, plain.Usage.PromptTokens)
	}
	base := `"model":"sim-model","messages":[{"role":"system","content":"You are an agent."},{"role":"user","content":"Weather in Paris?"}]`
	a := renderIDs(t, hs, "/v1/chat/completions/render", "{"+base+"}")
	b := renderIDs(t, hs, "/v1/chat/completions/render", "{"+base+`,"tools":[{"type":"function","function":{"name":"search"}}]}`)
	if slices.Equal(a[:16], b[:16]) {
		t.Fatalf("the first block is the same with and without tools: %v", a[:16])
	}
}

// Every field vLLM's chat rendering reads changes the rendered tokens; the
// render endpoint returns exactly the tokens chat completions computes
// (prompt_tokens), and /tokenize renders the same where vLLM's /tokenize has
// the field and ignores the fields it lacks.
func TestRenderHonoursEveryChatField(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 0, withBOS)
	const msgs = `"model":"sim-model","max_tokens":2,"messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"},{"role":"assistant","content":"Sure,"}]`
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type": "object"}}},{"type":"function","function":{"name":"search"}}]`
	base := renderIDs(t, hs, "/v1/chat/completions/render", "{"+msgs+"}")
	for _, tc := range []struct {
		name, fields string
		same         bool   // renders as with no field
		tokenize     bool   // /tokenize has the field: the same body gives the same tokens
		viaKwargs    string // for a field /tokenize lacks: chat_template_kwargs that give /tokenize the same tokens
	}{
		{name: "tools", fields: tools, tokenize: true},
		{name: "tool_choice with tools", fields: tools + `,"tool_choice":"required"`},
		{name: "tool_choice without tools", fields: `"tool_choice":"required"`, same: true, tokenize: true},
		{name: "chat_template", fields: `"chat_template":"{{ messages }}"`, tokenize: true},
		{name: "enable_thinking false", fields: `"chat_template_kwargs":{"enable_thinking":false}`, tokenize: true},
		{name: "enable_thinking true", fields: `"chat_template_kwargs":{"enable_thinking":true}`, same: true, tokenize: true},
		{name: "other kwargs", fields: `"chat_template_kwargs":{"unused":1}`, same: true, tokenize: true},
		{name: "no generation prompt", fields: `"add_generation_prompt":false`, tokenize: true},
		{name: "continue_final_message", fields: `"add_generation_prompt":false,"continue_final_message":true`, tokenize: true},
		{name: "add_special_tokens", fields: `"add_special_tokens":true`, tokenize: true},
		{name: "documents", fields: `"documents":[{"title":"a","text":"b"}]`, viaKwargs: `"chat_template_kwargs":{"documents":[{"title":"a","text":"b"}]}`},
		{name: "reasoning_effort", fields: `"reasoning_effort":"none"`, viaKwargs: `"chat_template_kwargs":{"reasoning_effort":"none","enable_thinking":false}`},
		{name: "reasoning_effort with enable_thinking", fields: `"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}`,
			viaKwargs: `"chat_template_kwargs":{"reasoning_effort":"none","enable_thinking":true}`},
		{name: "response_format", fields: `"response_format":{"type":"json_object"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := "{" + msgs + "," + tc.fields + "}"
			got := renderIDs(t, hs, "/v1/chat/completions/render", body)
			if slices.Equal(got, base) != tc.same {
				t.Fatalf("render with %s: %d tokens, %d without; want them equal: %v", tc.fields, len(got), len(base), tc.same)
			}
			if n := promptTokensOf(t, hs, "/v1/chat/completions", body); n != len(got) {
				t.Fatalf("chat completions computes %d prompt tokens, render returned %d", n, len(got))
			}
			if tk := tokenizeIDs(t, hs, body); slices.Equal(tk, got) != tc.tokenize {
				t.Fatalf("/tokenize of the same body: %d tokens, render %d; want them equal: %v", len(tk), len(got), tc.tokenize)
			}
			if tc.viaKwargs != "" {
				if tk := tokenizeIDs(t, hs, "{"+msgs+","+tc.viaKwargs+"}"); !slices.Equal(tk, got) {
					t.Fatalf("/tokenize with %s: %d tokens, render %d", tc.viaKwargs, len(tk), len(got))
				}
			}
		})
	}
}

// continue_final_message leaves the last message open, so the next turn
// (the continued message completed, a new message) extends the prompt and
// the reply; with add_generation_prompt (given or by default) it is a 400
// on every endpoint that renders, as vLLM's.
func TestContinueFinalMessage(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 0)
	const msgs = `"messages":[{"role":"user","content":"Count"},{"role":"assistant","content":"One, two,"}]`
	open := renderIDs(t, hs, "/v1/chat/completions/render", "{"+msgs+`,"continue_final_message":true,"add_generation_prompt":false}`)
	next := renderIDs(t, hs, "/v1/chat/completions/render", `{"messages":[{"role":"user","content":"Count"},{"role":"assistant","content":"One, two, three"},{"role":"user","content":"more"}]}`)
	if !slices.Equal(next[:len(open)], open) || string(appendText(nil, next[len(open):len(open)+6])) != " three" {
		t.Fatalf("the next turn does not extend the open message: %q then %q", appendText(nil, open), appendText(nil, next))
	}
	for _, tc := range []struct{ fields, msg string }{
		{`"continue_final_message":true,"add_generation_prompt":true`, errBothGiven},
		{`"continue_final_message":true`, errBothDefault},
	} {
		for _, path := range []string{"/v1/chat/completions", "/v1/chat/completions/render", "/tokenize"} {
			code, out := post(t, hs, path, "{"+msgs+","+tc.fields+"}")
			if code != http.StatusBadRequest || !strings.Contains(out, jsonText(tc.msg)) {
				t.Errorf("%s with %s: %d %s, want 400 %q", path, tc.fields, code, out, tc.msg)
			}
		}
	}
}

// jsonText is s as encoding/json writes it inside a string.
func jsonText(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

// With a BOS token, add_special_tokens (default true for completions and
// /tokenize prompts, false for chat) puts it in front of text prompts,
// never of token-id prompts; render, generate and /tokenize agree.
func TestAddSpecialTokens(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 0, withBOS)
	for _, tc := range []struct {
		name, body string
		bos        bool
	}{
		{"completion default", `{"prompt":"hello world","max_tokens":1}`, true},
		{"completion without", `{"prompt":"hello world","max_tokens":1,"add_special_tokens":false}`, false},
		{"completion list", `{"prompt":["hello world"],"max_tokens":1}`, true},
		{"completion ids", `{"prompt":[104,101],"max_tokens":1}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := renderIDs(t, hs, "/v1/completions/render", tc.body)
			if (ids[0] == BOSToken) != tc.bos {
				t.Fatalf("rendered %v: BOS first is %v, want %v", ids, ids[0] == BOSToken, tc.bos)
			}
			if n := promptTokensOf(t, hs, "/v1/completions", tc.body); n != len(ids) {
				t.Fatalf("completions computes %d prompt tokens, render returned %d", n, len(ids))
			}
		})
	}
	if tk := tokenizeIDs(t, hs, `{"prompt":"hi"}`); !slices.Equal(tk, []uint32{BOSToken, 'h', 'i'}) {
		t.Fatalf("/tokenize prompt: %v, want BOS h i", tk)
	}
	if tk := tokenizeIDs(t, hs, `{"messages":[{"role":"user","content":"hi"}]}`); tk[0] == BOSToken {
		t.Fatalf("/tokenize messages: %v starts with BOS, chat's add_special_tokens is false by default", tk)
	}
	if code, out := post(t, hs, "/detokenize", `{"tokens":[256,104,105]}`); code != http.StatusOK || !strings.Contains(out, jsonText("<s>hi")) {
		t.Fatalf("/detokenize BOS h i: %d %s", code, out)
	}
}

// DisableRender leaves the render endpoints out, as a vLLM from before
// them: 404, and everything else still served.
func TestDisableRender(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 0, func(c *Config) { c.DisableRender = true })
	for _, path := range []string{"/v1/chat/completions/render", "/v1/completions/render"} {
		if code, out := post(t, hs, path, `{"prompt":"hi","messages":[{"role":"user","content":"hi"}]}`); code != http.StatusNotFound {
			t.Errorf("%s: %d %s, want 404", path, code, out)
		}
	}
	if n := len(tokenizeIDs(t, hs, `{"prompt":"hi"}`)); n != 2 {
		t.Fatalf("/tokenize: %d tokens, want 2", n)
	}
}
