package vllmapi

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// streamChat streams one chat completion with the official client and
// returns the reply text and the usage chunk.
func streamChat(t *testing.T, client openai.Client, msgs []openai.ChatCompletionMessageParamUnion) (string, openai.CompletionUsage) {
	t.Helper()
	st := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         testModel,
		Messages:      msgs,
		MaxTokens:     openai.Int(16),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var text strings.Builder
	var use openai.CompletionUsage
	chunks, finish := 0, ""
	for st.Next() {
		c := st.Current()
		chunks++
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
		if c.Usage.TotalTokens > 0 {
			use = c.Usage
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if chunks < 3 || finish != "length" {
		t.Fatalf("got %d chunks, finish reason %q; want a role chunk, content chunks ending with finish_reason length, a usage chunk", chunks, finish)
	}
	return text.String(), use
}

// The official OpenAI Go client streams a chat and reads usage; the next
// turn of the conversation hits the prompt and the reply in the cache.
func TestOpenAIClientStreamsChatAndNextTurnIsCached(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 0)
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))

	turn1 := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage("You are a terse assistant that answers in one line."),
		openai.UserMessage("Tell me about prefix caching in vLLM, in one sentence please."),
	}
	reply, use1 := streamChat(t, client, turn1)
	if len(reply) != 16 || use1.CompletionTokens != 16 {
		t.Fatalf("reply %q (%d bytes), completion_tokens %d; want 16 of each", reply, len(reply), use1.CompletionTokens)
	}
	if want := int64(len(RenderChat([]Message{
		{Role: "system", Content: "You are a terse assistant that answers in one line."},
		{Role: "user", Content: "Tell me about prefix caching in vLLM, in one sentence please."},
	}, true))); use1.PromptTokens != want {
		t.Fatalf("prompt_tokens %d, want %d (one token per byte of the rendered chat)", use1.PromptTokens, want)
	}
	if use1.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first turn cached_tokens %d, want 0 on a cold cache", use1.PromptTokensDetails.CachedTokens)
	}

	turn2 := append(slices.Clone(turn1), openai.AssistantMessage(reply), openai.UserMessage("And why does it matter?"))
	_, use2 := streamChat(t, client, turn2)
	// Turn 1's prompt and its 15 fed-back reply tokens were cached in whole
	// 16-token blocks; turn 2 extends them, so all of those blocks hit.
	if want := (use1.PromptTokens + 15) / 16 * 16; use2.PromptTokensDetails.CachedTokens != want {
		t.Fatalf("second turn cached_tokens %d, want %d (turn 1's prompt and reply blocks)", use2.PromptTokensDetails.CachedTokens, want)
	}
}

// The chat template makes turn N+1's tokens a strict extension of turn N's
// prompt followed by its reply, as /tokenize shows.
func TestTokenizeNextTurnExtendsPromptAndReply(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 4096)
	tok := func(body string) tokenizeReply {
		t.Helper()
		r := tokenizeReplyOf(t, hs, body)
		if r.Count != len(r.Tokens) || r.MaxModelLen != 4096 {
			t.Fatalf("/tokenize reply %+v: count or max_model_len wrong", r)
		}
		return r
	}
	t1 := tok(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true}`)
	reply := tok(`{"prompt":"xq zk"}`)
	t2 := tok(`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":"xq zk"},{"role":"user","content":"more"}]}`)
	prefix := append(slices.Clone(t1.Tokens), reply.Tokens...)
	if len(t2.Tokens) <= len(prefix) || !slices.Equal(t2.Tokens[:len(prefix)], prefix) {
		t.Fatalf("turn 2 %v does not strictly extend turn 1 + reply %v", t2.Tokens, prefix)
	}
	code, out := post(t, hs, "/detokenize", `{"model":"sim-model","tokens":[104,105]}`)
	if code != http.StatusOK || strings.TrimSpace(out) != `{"prompt":"hi"}` {
		t.Fatalf("/detokenize: %d %s, want 200 {\"prompt\":\"hi\"}", code, out)
	}
}

// A whole (not streamed) completion has vLLM's shape and usage.
func TestCompletionWholeReply(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 0)
	code, out := post(t, hs, "/v1/completions", `{"model":"sim-model","prompt":"Hello there","max_tokens":5,"temperature":0.7,"unknown_field":{"x":1}}`)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, out)
	}
	var r completionReply
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("reply %s: %v", out, err)
	}
	if r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") || r.Model != testModel || len(r.Choices) != 1 {
		t.Fatalf("reply %s: wrong envelope", out)
	}
	c := r.Choices[0]
	if len(c.Text) != 5 || c.FinishReason == nil || *c.FinishReason != "length" {
		t.Fatalf("reply %s: want 5 characters of text and finish_reason length", out)
	}
	if u := r.Usage; u == nil || u.PromptTokens != 11 || u.CompletionTokens != 5 || u.TotalTokens != 16 {
		t.Fatalf("reply %s: usage wrong", out)
	}
}

// The simulator's sim_output_tokens ends the reply before max_tokens, as a
// model's end of sequence would (finish_reason stop); at or above
// max_tokens it changes nothing; below 1 it is refused.
func TestSimOutputTokens(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 0)
	for _, c := range []struct {
		body   string
		text   int
		finish string
	}{
		{`{"prompt":"Hello","max_tokens":8,"sim_output_tokens":3}`, 3, "stop"},
		{`{"prompt":"Hello","max_tokens":8,"sim_output_tokens":12}`, 8, "length"},
	} {
		code, out := post(t, hs, "/v1/completions", c.body)
		var r completionReply
		if err := json.Unmarshal([]byte(out), &r); code != http.StatusOK || err != nil || len(r.Choices) != 1 {
			t.Fatalf("%s: status %d: %s", c.body, code, out)
		}
		if ch := r.Choices[0]; len(ch.Text) != c.text || *ch.FinishReason != c.finish || r.Usage.CompletionTokens != c.text {
			t.Fatalf("%s: reply %s, want %d tokens ending %q", c.body, out, c.text, c.finish)
		}
	}
	if code, out := post(t, hs, "/v1/completions", `{"prompt":"Hello","max_tokens":8,"sim_output_tokens":0}`); code != http.StatusBadRequest {
		t.Fatalf("sim_output_tokens 0: status %d: %s", code, out)
	}
}

// Each bad input gets vLLM's status and an OpenAI error object.
func TestBadInput(t *testing.T) {
	hs, eng := newTestServer(t, sim.Config{}, 64)
	cases := []struct {
		name, path, body string
		rank             string // RankHeader value, "" = none
		status           int
		typ, inMessage   string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model":"sim-model","messages":[`, "", 400, "BadRequestError", "malformed JSON"},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"hi","max_tokens":1}`, "", 404, "NotFoundError", "`gpt-9` does not exist"},
		{"prompt plus max_tokens over max model len", "/v1/completions", `{"prompt":"hello","max_tokens":60}`, "", 400, "BadRequestError", "maximum context length is 64"},
		{"prompt alone over max model len", "/v1/completions", `{"prompt":[` + strings.Repeat("1,", 64) + `1]}`, "", 400, "BadRequestError", "65 input tokens"},
		{"max_tokens zero", "/v1/completions", `{"prompt":"hi","max_tokens":0}`, "", 400, "BadRequestError", "at least 1"},
		{"n above one", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"n":2}`, "", 400, "BadRequestError", "n = 2"},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, "", 400, "BadRequestError", "at least one message"},
		{"token id out of range", "/v1/completions", `{"prompt":[1,-2],"max_tokens":1}`, "", 400, "BadRequestError", "token id -2"},
		{"detokenize outside vocabulary", "/detokenize", `{"tokens":[300]}`, "", 400, "BadRequestError", "token 300"},
		{"data after the object", "/tokenize", `{"prompt":"a"} {}`, "", 400, "BadRequestError", "data after"},
		{"bad rank header", "/v1/completions", `{"prompt":"hi","max_tokens":1}`, "3", 400, "BadRequestError", RankHeader},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, hs.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.rank != "" {
				req.Header.Set(RankHeader, tc.rank)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e errorBody
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("error reply is not JSON: %v", err)
			}
			if resp.StatusCode != tc.status || e.Error.Code != tc.status || e.Error.Type != tc.typ || !strings.Contains(e.Error.Message, tc.inMessage) {
				t.Fatalf("got %d %+v; want %d %s with %q in the message", resp.StatusCode, e.Error, tc.status, tc.typ, tc.inMessage)
			}
		})
	}
	if n := eng.InFlight(); n != 0 {
		t.Fatalf("%d requests reached the engine; bad input must be refused before", n)
	}
}

// A client that disconnects mid-stream aborts its request: the engine
// drops it and its blocks are free again.
func TestDisconnectMidStreamFreesBlocks(t *testing.T) {
	hs, eng := newTestServer(t, sim.Config{Speedup: 1}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions",
		strings.NewReader(`{"prompt":"`+strings.Repeat("a long prompt ", 40)+`","max_tokens":4000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatalf("reading the first chunk: %v", err)
	}
	if l := eng.Load()[0]; l.ActiveRequests != 1 || l.KVUsedBlocks == 0 {
		t.Fatalf("mid-stream load %+v: want one running request holding blocks", l)
	}
	cancel()
	resp.Body.Close()
	testutil.Eventually(t, 5*time.Second, func() bool {
		l := eng.Load()[0]
		return eng.InFlight() == 0 && l.KVUsedBlocks == 0
	}, func() string { return "request still in flight or blocks held after the disconnect" })
	if st := eng.Stats()[0]; st.Failed != 1 || st.Completed != 0 {
		t.Fatalf("stats %+v: want the request failed (cancelled), none completed", st)
	}
}
