package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

const imageChatBody = `{"model":"m","messages":[{"role":"system","content":"be brief, be brief, be brief"},` +
	`{"role":"user","content":[{"type":"text","text":"what is it?"},{"type":"image_url","image_url":{"url":"https://x/cat.png"},"uuid":"cat-1"},` +
	`{"type":"text","text":"and this?"},{"type":"image_url","image_url":{"url":"https://x/dog.png"}}]}]}`

func TestChatMediaParts(t *testing.T) {
	var cr clientRequest
	if err := json.Unmarshal([]byte(imageChatBody), &cr); err != nil {
		t.Fatal(err)
	}
	if got := chatMediaParts(cr.Messages); !slices.Equal(got, []mediaPart{{uuid: "cat-1"}, {}}) {
		t.Fatalf("parts %+v", got)
	}
	if got := chatMediaParts(json.RawMessage(`[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"x"}]}]`)); got != nil {
		t.Fatalf("a chat without media: %+v", got)
	}
	stripped, err := withoutMedia(cr.Messages)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(stripped), "image_url") || !strings.Contains(string(stripped), "and this?") || chatMediaParts(stripped) != nil {
		t.Fatalf("without media: %s", stripped)
	}
}

// Items a render endpoint gives are taken when the router accepts them;
// otherwise the route stops at the first position they name.
func TestSafeItems(t *testing.T) {
	good := []kvevents.MediaItem{{ID: "a", Offset: 2, Length: 3}, {Offset: 5, Length: 1}}
	if got := safeItems(good, 10); !slices.Equal(got, good) {
		t.Fatalf("good items changed: %+v", got)
	}
	for _, bad := range [][]kvevents.MediaItem{
		{{ID: "a", Offset: 4, Length: 3}, {ID: "b", Offset: 5, Length: 1}},
		{{ID: "a", Offset: 4, Length: 30}},
		{{ID: "a", Offset: 4, Length: 0}},
	} {
		if got := safeItems(bad, 10); !slices.Equal(got, []kvevents.MediaItem{{Offset: 4, Length: 1}}) {
			t.Errorf("%+v: got %+v", bad, got)
		}
	}
}

// mediaEngine is a simulated engine's HTTP face, with vLLM's render
// endpoint when render is set (served by vllmapi's RenderChat), counting
// render calls.
func mediaEngine(t *testing.T, render bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	eng, err := sim.New(sim.Config{Worker: "e", Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close(context.Background()) })
	face, err := vllmapi.New(vllmapi.Config{Engine: eng, ImageTokens: 32})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("/", face)
	if render {
		mux.HandleFunc("POST /v1/chat/completions/render", func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			var body json.RawMessage
			_ = json.NewDecoder(r.Body).Decode(&body)
			toks, f, err := face.RenderChat(body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"token_ids": toks, "features": f})
		})
	} else {
		mux.HandleFunc("POST /v1/chat/completions/render", func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			http.NotFound(w, r)
		})
	}
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s, &calls
}

// With a render endpoint the gateway routes on the engine's token ids with
// every item (the engine's hashes); without one, on /tokenize's token ids
// with one item of unknown identifier where the first image starts, and it
// stops asking for a render endpoint the engine does not have.
func TestTokenizeMedia(t *testing.T) {
	var cr clientRequest
	if err := json.Unmarshal([]byte(imageChatBody), &cr); err != nil {
		t.Fatal(err)
	}
	cr.body = []byte(imageChatBody)
	parts := chatMediaParts(cr.Messages)
	first := len("<|system|>\nbe brief, be brief, be brief<|end|>\n<|user|>\nwhat is it?\n")

	s, calls := mediaEngine(t, true)
	g, err := New(Config{Router: fakeRouter{engine: s.URL}, Models: []string{testModel}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := g.tokenizeMedia(context.Background(), s.URL, &cr, parts)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Media) != 2 || tr.Media[0] != (kvevents.MediaItem{ID: "cat-1", Offset: first, Length: 32}) ||
		tr.Media[1].ID == "" || tr.Media[1].Length != 32 || calls.Load() != 1 {
		t.Fatalf("with render: items %+v, %d render calls", tr.Media, calls.Load())
	}
	withRender := tr.Tokens

	s, calls = mediaEngine(t, false)
	for range 2 {
		tr, err = g.tokenizeMedia(context.Background(), s.URL, &cr, parts)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(tr.Media, []kvevents.MediaItem{{Offset: first, Length: 1}}) || !slices.Equal(tr.Tokens, withRender) {
			t.Fatalf("without render: items %+v, tokens equal %v", tr.Media, slices.Equal(tr.Tokens, withRender))
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("%d render calls to an engine without one, want 1", calls.Load())
	}
}
