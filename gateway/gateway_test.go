package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// longText is a prompt of n bytes (the simulator's tokenizer is
// byte-level: n tokens).
func longText(seed string, n int) string {
	return strings.Repeat(seed+" ", n/(len(seed)+1)+1)[:n]
}

func chatParams(stream bool, msgs ...openai.ChatCompletionMessageParamUnion) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, MaxCompletionTokens: openai.Int(8)}
	if stream {
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	}
	return p
}

// Streaming and whole replies of both endpoints through the official
// client; the routing headers are set; every booking is freed.
func TestChatAndCompletions(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 2})
	c := client(f.gateway(nil, nil))
	ctx := ctxT(t)
	cases := []struct {
		name string
		run  func(t *testing.T, hr **http.Response) string
	}{
		{"chat", func(t *testing.T, hr **http.Response) string {
			r, err := c.Chat.Completions.New(ctx, chatParams(false, openai.UserMessage(longText("hello chat", 100))), option.WithResponseInto(hr))
			if err != nil {
				t.Fatal(err)
			}
			return r.Choices[0].Message.Content
		}},
		{"chat stream", func(t *testing.T, hr **http.Response) string {
			s := c.Chat.Completions.NewStreaming(ctx, chatParams(true, openai.UserMessage(longText("hello stream", 100))), option.WithResponseInto(hr))
			var acc openai.ChatCompletionAccumulator
			for s.Next() {
				acc.AddChunk(s.Current())
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			if acc.Usage.CompletionTokens != 8 {
				t.Errorf("usage %+v, want 8 completion tokens", acc.Usage)
			}
			return acc.Choices[0].Message.Content
		}},
		{"completion", func(t *testing.T, hr **http.Response) string {
			r, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: testModel, MaxTokens: openai.Int(8),
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(longText("hello completion", 100))}}, option.WithResponseInto(hr))
			if err != nil {
				t.Fatal(err)
			}
			return r.Choices[0].Text
		}},
		{"completion stream", func(t *testing.T, hr **http.Response) string {
			s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: testModel, MaxTokens: openai.Int(8),
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(longText("hello completion stream", 100))}}, option.WithResponseInto(hr))
			var b strings.Builder
			for s.Next() {
				for _, ch := range s.Current().Choices {
					b.WriteString(ch.Text)
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			return b.String()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var hr *http.Response
			if text := tc.run(t, &hr); text == "" {
				t.Error("empty reply")
			}
			if w := hr.Header.Get(HeaderWorker); w != "e0#0" && w != "e1#0" {
				t.Errorf("%s = %q", HeaderWorker, w)
			}
			if hr.Header.Get(HeaderOverlapBlocks) == "" || hr.Header.Get(HeaderSessionOutcome) != "none" {
				t.Errorf("routing headers %v", hr.Header)
			}
			// The route call took some time, the whole request longer.
			if route, _, ok := ParseServerTiming(hr.Header.Values(HeaderServerTiming)); !ok || route <= 0 || route > time.Minute {
				t.Errorf("%s %q: route %v (found %v)", HeaderServerTiming, hr.Header.Values(HeaderServerTiming), route, ok)
			}
		})
	}
	f.waitIdle()
}

// The next turn of a conversation goes to the worker that served the
// first, and the engine reports the cached prefix.
func TestNextTurnSameWorkerCached(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 2})
	c := client(f.gateway(nil, nil))
	ctx := ctxT(t)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage(longText("tell me about caches", 300))}
	var first string
	for turn := range 3 {
		var hr *http.Response
		r, err := c.Chat.Completions.New(ctx, chatParams(false, msgs...), option.WithResponseInto(&hr))
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		w := hr.Header.Get(HeaderWorker)
		if turn == 0 {
			first = w
		} else {
			if w != first {
				t.Fatalf("turn %d went to %s, the conversation is on %s", turn, w, first)
			}
			if r.Usage.PromptTokensDetails.CachedTokens == 0 {
				t.Errorf("turn %d: cached_tokens 0", turn)
			}
			if n, _ := strconv.Atoi(hr.Header.Get(HeaderOverlapBlocks)); n == 0 {
				t.Errorf("turn %d: overlap 0 blocks", turn)
			}
		}
		msgs = append(msgs, openai.AssistantMessage(r.Choices[0].Message.Content), openai.UserMessage("and then? "+strconv.Itoa(turn)))
	}
	f.waitIdle()
}

// With a session header, every turn of a Hard session lands on its worker
// through two gateways and two replicas (over NATS); a Soft session keeps
// its preference while the worker is a candidate.
func TestSessionsAcrossGatewaysAndReplicas(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 2, engines: 2})
	gws := []openai.Client{client(f.gateway(f.natsRouter(), nil)), client(f.gateway(f.natsRouter(), func(c *Config) { c.SessionHeader = "X-Conversation" }))}
	headers := []string{DefaultSessionHeader, "X-Conversation"}
	ctx := ctxT(t)
	for _, mode := range []string{"hard", "soft"} {
		t.Run(mode, func(t *testing.T) {
			var bound string
			for turn := range 6 {
				i := turn % 2
				var hr *http.Response
				// A different prompt each turn: only the session keeps it in place.
				_, err := gws[i].Chat.Completions.New(ctx, chatParams(false, openai.UserMessage(longText("turn "+strconv.Itoa(turn)+mode, 64))),
					option.WithHeader(headers[i], "s-"+mode), option.WithHeader(ModeHeader, mode), option.WithResponseInto(&hr))
				if err != nil {
					t.Fatalf("turn %d: %v", turn, err)
				}
				w, outcome := hr.Header.Get(HeaderWorker), hr.Header.Get(HeaderSessionOutcome)
				switch {
				case turn == 0 && outcome != "created":
					t.Fatalf("turn 0 outcome %q", outcome)
				case turn == 0:
					bound = w
				case w != bound:
					t.Fatalf("turn %d (gateway %d) went to %s, session bound to %s (outcome %s)", turn, i, w, bound, outcome)
				}
			}
		})
	}
	f.waitIdle()
}

// A client that goes away mid-stream aborts the engine's request and frees
// the booking.
func TestClientCancelMidStream(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 1})
	c := client(f.gateway(nil, nil))
	ctx, cancel := context.WithCancel(ctxT(t))
	p := chatParams(true, openai.UserMessage(longText("a long story", 64)))
	p.MaxCompletionTokens = openai.Int(3000)
	s := c.Chat.Completions.NewStreaming(ctx, p)
	for i := 0; i < 3 && s.Next(); i++ {
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	cancel()
	s.Close()
	f.waitIdle()
	eng := f.engines[0].eng
	testutil.Eventually(t, 10*time.Second, func() bool {
		l := eng.Load()[0]
		return l.ActiveRequests == 0 && l.WaitingRequests == 0
	}, func() string { return "the engine still runs the cancelled request" })
}

// An engine killed mid-stream: the client gets an error event, the booking
// is freed, the next request goes to another worker.
func TestEngineKilledMidStream(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 2})
	c := client(f.gateway(nil, nil))
	ctx := ctxT(t)
	p := chatParams(true, openai.UserMessage(longText("a long story", 64)))
	p.MaxCompletionTokens = openai.Int(3000)
	var hr *http.Response
	s := c.Chat.Completions.NewStreaming(ctx, p, option.WithResponseInto(&hr))
	for i := 0; i < 3 && s.Next(); i++ {
	}
	victim := strings.TrimSuffix(hr.Header.Get(HeaderWorker), "#0")
	for _, e := range f.engines {
		if e.id == victim {
			e.kill()
		}
	}
	for s.Next() {
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "upstream_error") {
		t.Fatalf("stream error %v, want the gateway's upstream_error event", err)
	}
	s.Close()
	f.waitWorkers(1)
	f.waitIdle()
	var hr2 *http.Response
	if _, err := c.Chat.Completions.New(ctx, chatParams(false, openai.UserMessage("next")), option.WithResponseInto(&hr2)); err != nil {
		t.Fatal(err)
	}
	if w := hr2.Header.Get(HeaderWorker); strings.HasPrefix(w, victim+"#") {
		t.Fatalf("next request went to the killed engine %s", w)
	}
	f.waitIdle()
}

// An engine that refuses connections: the request is retried once on
// another worker and succeeds; the retry is counted.
func TestConnectionRefusedRetries(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 1})
	ctx := ctxT(t)
	dead := workers.Info{ID: "dead", Model: testModel, Endpoint: refusingEndpoint(t), Ranks: []uint32{0}, BlockSize: 16,
		KVBlocks: 4096, MaxBatchedTokens: 8192, MaxSeqs: 256}
	reg, err := workers.Register(ctx, f.js, testRegistry(), dead)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Deregister(context.Background()) })
	f.waitWorkers(2)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c := client(f.gateway(nil, func(c *Config) { c.Telemetry.MeterProvider = mp }))
	// Concurrent requests spread over both workers: some are routed to
	// the dead one first.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := chatParams(false, openai.UserMessage(longText("retry me "+strconv.Itoa(i), 64)))
			p.MaxCompletionTokens = openai.Int(200)
			var hr *http.Response
			if _, err := c.Chat.Completions.New(ctx, p, option.WithResponseInto(&hr)); err != nil {
				errs <- err
			} else if w := hr.Header.Get(HeaderWorker); w != "e0#0" {
				errs <- errors.New("served by " + w)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := testutil.SumCounter(t, reader, "kvr_gateway_retries_total"); n == 0 {
		t.Error("no retry counted")
	}
	f.waitIdle()
}

// GET /v1/models lists the models with live workers.
func TestModels(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 1})
	c := client(f.gateway(nil, func(c *Config) { c.Models = []string{testModel, "idle-model"} }))
	page, err := c.Models.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != testModel {
		t.Fatalf("models %+v, want only %q", page.Data, testModel)
	}
}
