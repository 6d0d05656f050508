package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// simFace is a simulated engine's HTTP face (with a BOS token) that counts
// the /tokenize and render requests reaching it. The engine does not run:
// tokenizing and rendering need no engine step.
type simFace struct {
	*httptest.Server
	tokenize, render atomic.Int64
}

func newSimFace(t *testing.T, disableRender bool) *simFace {
	t.Helper()
	eng, err := sim.New(sim.Config{Worker: "w", Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close(context.Background()) })
	face, err := vllmapi.New(vllmapi.Config{Engine: eng, Model: testModel, BOS: true, DisableRender: disableRender, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	sf := &simFace{}
	sf.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/tokenize":
			sf.tokenize.Add(1)
		case strings.HasSuffix(r.URL.Path, "/render"):
			sf.render.Add(1)
		}
		face.ServeHTTP(w, r)
	}))
	t.Cleanup(sf.Close)
	return sf
}

// tokenizeBody runs the gateway's tokenize step on body against root.
func tokenizeBodyAt(t *testing.T, g *Gateway, root, kind, body string) (*tokenizeReply, error) {
	t.Helper()
	cr, rerr := readRequest(kind, []byte(body))
	if rerr != nil {
		t.Fatalf("%s: %v", body, rerr)
	}
	return g.tokenize(context.Background(), root, kind, &cr, []byte(body))
}

func newTestGateway(t *testing.T) *Gateway {
	t.Helper()
	g, err := New(Config{Router: fakeRouter{}, Models: []string{testModel}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.http.CloseIdleConnections)
	return g
}

// The gateway's tokens are the engine's for every field that shapes the
// prompt: from the render endpoint always, from /tokenize (an engine
// without render endpoints) for the fields /tokenize has; a request with a
// field /tokenize lacks is marked unknown (no tokens) rather than routed on
// tokens the engine will not compute. The oracle is the engine's own
// render, which the simulator computes as its generate endpoints do
// (vllmapi.TestRenderHonoursEveryChatField).
func TestTokenizeIsTheEnginesPrompt(t *testing.T) {
	withRender, without := newSimFace(t, false), newSimFace(t, true)
	g := newTestGateway(t)
	const msgs = `"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"},{"role":"assistant","content":"Sure,"}]`
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	for _, tc := range []struct {
		name, kind, body string
		unknown          string // the field that makes the fallback's tokens unknown
	}{
		{name: "plain chat", kind: kindChat, body: "{" + msgs + "}"},
		{name: "tools", kind: kindChat, body: "{" + msgs + "," + tools + "}"},
		{name: "tool_choice", kind: kindChat, body: "{" + msgs + "," + tools + `,"tool_choice":"required"}`, unknown: "tool_choice"},
		{name: "tool_choice without tools", kind: kindChat, body: "{" + msgs + `,"tool_choice":"none"}`},
		{name: "chat_template", kind: kindChat, body: "{" + msgs + `,"chat_template":"{{ messages }}"}`},
		{name: "chat_template_kwargs", kind: kindChat, body: "{" + msgs + `,"chat_template_kwargs":{"enable_thinking":false}}`},
		{name: "continue_final_message", kind: kindChat, body: "{" + msgs + `,"add_generation_prompt":false,"continue_final_message":true}`},
		{name: "add_special_tokens", kind: kindChat, body: "{" + msgs + `,"add_special_tokens":true}`},
		{name: "documents", kind: kindChat, body: "{" + msgs + `,"documents":[{"title":"t","text":"x"}]}`, unknown: "documents"},
		{name: "reasoning_effort", kind: kindChat, body: "{" + msgs + `,"reasoning_effort":"none"}`, unknown: "reasoning_effort"},
		{name: "response_format", kind: kindChat, body: "{" + msgs + `,"response_format":{"type":"json_object"}}`, unknown: "response_format"},
		{name: "completion text", kind: kindCompletion, body: `{"model":"m","prompt":"hello world"}`},
		{name: "completion without special tokens", kind: kindCompletion, body: `{"model":"m","prompt":["hello world"],"add_special_tokens":false}`},
		{name: "completion ids", kind: kindCompletion, body: `{"model":"m","prompt":[1,2,300]}`},
		{name: "completion ids truncated", kind: kindCompletion, body: `{"model":"m","prompt":[1,2,300],"truncate_prompt_tokens":2}`, unknown: "truncate_prompt_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := tokenizeBodyAt(t, g, withRender.URL, tc.kind, tc.body)
			if err != nil || want.Unknown != "" || len(want.Tokens) == 0 {
				t.Fatalf("render path: %+v, %v; want the engine's tokens", want, err)
			}
			oracle := renderOf(t, g, withRender.URL, tc.kind, tc.body)
			if !slices.Equal(want.Tokens, oracle) {
				t.Fatalf("render path %v, the engine renders %v", want.Tokens, oracle)
			}
			got, err := tokenizeBodyAt(t, g, without.URL, tc.kind, tc.body)
			switch {
			case err != nil:
				t.Fatalf("/tokenize path: %v", err)
			case got.Unknown != tc.unknown:
				t.Fatalf("/tokenize path: unknown %q, want %q", got.Unknown, tc.unknown)
			case tc.unknown != "" && (got.Tokens != nil || got.Count == 0):
				t.Fatalf("/tokenize path, unknown prompt: tokens %v count %d; want no tokens and a length", got.Tokens, got.Count)
			case tc.unknown == "" && !slices.Equal(got.Tokens, oracle):
				t.Fatalf("/tokenize path %v, the engine renders %v", got.Tokens, oracle)
			}
		})
	}
	// A batch of prompts has no single tokenization either way.
	for _, root := range []string{withRender.URL, without.URL} {
		if _, err := tokenizeBodyAt(t, g, root, kindCompletion, `{"model":"m","prompt":["a","b"]}`); !errors.Is(err, errNoTokenize) {
			t.Errorf("batch at %s: %v, want errNoTokenize", root, err)
		}
	}
}

// renderOf is the engine's own render of body.
func renderOf(t *testing.T, g *Gateway, root, kind, body string) []uint32 {
	t.Helper()
	tr, err := g.render(context.Background(), root, kind, []byte(body))
	if err != nil {
		t.Fatalf("render %s: %v", body, err)
	}
	return tr.Tokens
}

// An engine without render endpoints is probed once, even by concurrent
// first requests (those that come while the probe runs use /tokenize), and
// served by /tokenize after; one with them, once probed, is never sent to
// /tokenize.
func TestRenderProbedOncePerEngine(t *testing.T) {
	withRender, without := newSimFace(t, false), newSimFace(t, true)
	g := newTestGateway(t)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	if _, err := tokenizeBodyAt(t, g, withRender.URL, kindChat, body); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*simFace{without, withRender} {
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				if tr, err := tokenizeBodyAt(t, g, e.URL, kindChat, body); err != nil || len(tr.Tokens) == 0 {
					t.Errorf("%s: %+v, %v", e.URL, tr, err)
				}
			})
		}
		wg.Wait()
	}
	if r, tk := without.render.Load(), without.tokenize.Load(); r != 1 || tk+r != 17 {
		t.Errorf("engine without render endpoints: %d render and %d /tokenize calls for 16 requests; want 1 probe, then /tokenize", r, tk)
	}
	if r, tk := withRender.render.Load(), withRender.tokenize.Load(); r != 17 || tk != 0 {
		t.Errorf("engine with render endpoints: %d render and %d /tokenize calls for 1 + 16 requests; want 17 and 0", r, tk)
	}
}

// The probe's states: one prober at a time, a missing endpoint probed again
// after renderRetry, an engine that did not answer probed again at once.
func TestRenderProbeStates(t *testing.T) {
	var p renderProbe
	now := time.Now()
	if !p.use(now) || p.use(now) {
		t.Fatal("want exactly one prober of an unknown engine")
	}
	p.done(errors.New("connection refused"), now)
	if !p.use(now) {
		t.Fatal("an engine that did not answer is probed again")
	}
	p.done(errNoRender, now)
	if p.use(now.Add(renderRetry - time.Second)) {
		t.Fatal("a missing endpoint is probed again before renderRetry")
	}
	if !p.use(now.Add(renderRetry)) || p.use(now.Add(renderRetry)) {
		t.Fatal("want one new probe after renderRetry")
	}
	p.done(&tokenizeStatusError{status: http.StatusBadRequest}, now)
	if !p.use(now) || !p.use(now) { // two requests in a row, both use it
		t.Fatal("an endpoint that answered (even 400) is used by every request")
	}
}

// A 404 for an unknown model is the endpoint answering, not a missing
// endpoint.
func TestRenderModelNotFoundIsNotMissing(t *testing.T) {
	e := newSimFace(t, false)
	g := newTestGateway(t)
	_, err := g.render(context.Background(), e.URL, kindChat, []byte(`{"model":"other","messages":[{"role":"user","content":"hi"}]}`))
	var se *tokenizeStatusError
	if errors.Is(err, errNoRender) || !errors.As(err, &se) || se.status != http.StatusNotFound {
		t.Fatalf("render of an unknown model: %v; want the engine's 404, not errNoRender", err)
	}
}

// decodeRenderReply reads the top-level token_ids of one rendered request
// or a list of one, and stops before the first media placeholder.
func TestDecodeRenderReply(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []uint32
		err        bool
	}{
		{"chat", `{"request_id":"r","token_ids":[1,2,3],"features":null,"sampling_params":{"stop_token_ids":[9]}}`, []uint32{1, 2, 3}, false},
		{"completion list", `[{"request_id":"r","token_ids":[4,5],"features":null}]`, []uint32{4, 5}, false},
		{"nested key first", `{"sampling_params":{"x":{"token_ids":[9]}},"token_ids":[1]}`, []uint32{1}, false},
		{"duplicate keys: the last counts", `{"token_ids":[1],"token_ids":[2]}`, []uint32{2}, false},
		{"media", `{"token_ids":[1,2,3,4,5,6],"features":{"mm_hashes":{"image":["h1","h2"]},"mm_placeholders":{"image":[{"offset":4,"length":2},{"offset":2,"length":1}]}}}`, []uint32{1, 2}, false},
		{"bad id", `{"token_ids":[-1]}`, nil, true},
		{"not json", `{"token_ids":[1]`, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeRenderReply([]byte(tc.data))
			if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
				t.Fatalf("%v, %v; want %v (error %v)", got, err, tc.want, tc.err)
			}
		})
	}
	if _, err := decodeRenderReply([]byte(`[{"token_ids":[1]},{"token_ids":[2]}]`)); !errors.Is(err, errNoTokenize) {
		t.Fatalf("a list of two: %v, want errNoTokenize", err)
	}
}

// decodeRenderReply reads the token_ids encoding/json reads from a
// rendered request, and refuses what it refuses.
func FuzzDecodeRenderReply(f *testing.F) {
	for _, s := range []string{`{"request_id":"r","token_ids":[1,2,3],"features":null}`, `{"token_ids" : [ 4294967295 , 0 ]}`,
		`{"token_ids":[4294967296]}`, `{"token_ids":[1,]}`, `{"x":"\"token_ids\":[1]","token_ids":[2]}`, `{"m":{"token_ids":[1]},"token_ids":[2]}`,
		`{"token_ids":[1],"token_ids":[2]}`, `{"token_ids":[1],"token_ids":null}`, `{"m":{"token_ids":[1]}}`, `{"token_ids":["1"]}`, `{"token_ids":[1]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if t := strings.TrimSpace(string(data)); t != "" && t[0] == '[' {
			return // lists: TestDecodeRenderReply
		}
		got, err := decodeRenderReply(data)
		var want struct {
			TokenIDs []uint32 `json:"token_ids"`
			Features any      `json:"features"`
		}
		jerr := json.Unmarshal(data, &want)
		switch {
		case err == nil && jerr != nil:
			t.Fatalf("%q: accepted %v, encoding/json: %v", data, got, jerr)
		case err != nil && jerr == nil && len(want.TokenIDs) > 0 && want.Features == nil:
			t.Fatalf("%q: refused (%v), encoding/json reads %v", data, err, want.TokenIDs)
		case err == nil && want.Features == nil && !slices.Equal(got, want.TokenIDs) && len(got)+len(want.TokenIDs) > 0:
			t.Fatalf("%q: %v, encoding/json %v", data, got, want.TokenIDs)
		}
	})
}
