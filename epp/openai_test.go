package epp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvrouter/kvrouter/gateway"
)

// proxy is a small stand-in for an Envoy-based gateway: each HTTP request
// goes through the picker's ext_proc stream, to the endpoint the
// destination header names, and the reply comes back through the picker.
func (f *fleet) proxy(t *testing.T) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		q := envoyRequest{method: r.Method, path: r.URL.Path, body: body, chunks: 3, seed: uint64(len(body)), down: w,
			header: map[string]string{}}
		if v := r.Header.Get(gateway.DefaultSessionHeader); v != "" {
			q.header[gateway.DefaultSessionHeader] = v
		}
		// The proxy finishes the exchange with the picker even when the
		// client, its answer complete, has already gone.
		if _, err := f.envoy(context.WithoutCancel(r.Context()), q); err != nil {
			t.Errorf("%s %s through the picker: %v", r.Method, r.URL.Path, err)
		}
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// The official OpenAI client through a proxy that honours the picker's
// destination: chat and completions, streamed and whole, a session that
// stays on its worker, and /v1/models (a request the router does not
// route, sent to a live worker).
func TestOpenAIClientThroughProxy(t *testing.T) {
	f := startFleet(t, 2, nil)
	c := openai.NewClient(option.WithBaseURL(f.proxy(t)+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: &http.Transport{}}))
	ctx := ctxT(t)
	prompt := longText("the end to end path", 200)

	var hr *http.Response
	r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, MaxCompletionTokens: openai.Int(8),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}, option.WithResponseInto(&hr))
	if err != nil {
		t.Fatal(err)
	}
	if r.Choices[0].Message.Content == "" || hr.Header.Get(gateway.HeaderWorker) == "" {
		t.Fatalf("chat: content %q, worker header %q", r.Choices[0].Message.Content, hr.Header.Get(gateway.HeaderWorker))
	}

	var worker string
	for turn := range 3 {
		s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: testModel, MaxCompletionTokens: openai.Int(8),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(longText("turn", 50+turn))}},
			option.WithHeader(gateway.DefaultSessionHeader, "s-1"), option.WithResponseInto(&hr))
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if err := s.Err(); err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		if acc.Choices[0].Message.Content == "" {
			t.Fatalf("turn %d: no content", turn)
		}
		w := hr.Header.Get(gateway.HeaderWorker)
		if turn == 0 {
			worker = w
		} else if w != worker {
			t.Fatalf("turn %d of the session went to %s, bound to %s", turn, w, worker)
		}
	}

	cr, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: testModel, MaxTokens: openai.Int(8),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}})
	if err != nil || cr.Choices[0].Text == "" {
		t.Fatalf("completion: %v", err)
	}
	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) == 0 || models.Data[0].ID != testModel {
		t.Fatalf("models: %v %+v", err, models)
	}
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "nope",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("unknown model: %v, want a 404 the client reads", err)
	}
	f.waitIdle()
}
