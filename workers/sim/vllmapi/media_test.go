package vllmapi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/workers/sim"
)

// newMediaServer is a test engine whose images expand to n placeholders.
func newMediaServer(t *testing.T, n int) (*httptest.Server, *Server) {
	t.Helper()
	hs, srv, _ := newTestFace(t, sim.Config{}, Config{ImageTokens: n})
	return hs, srv
}

// imageChat is a chat body: a text, an image part (with uuid when given),
// another text.
func imageChat(url, uuid string) string {
	part := fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q}}`, url)
	if uuid != "" {
		part = fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q},"uuid":%q}`, url, uuid)
	}
	return `{"model":"` + testModel + `","max_tokens":1,"messages":[{"role":"system","content":"` + strings.Repeat("s", 40) +
		`"},{"role":"user","content":[{"type":"text","text":"look:"},` + part + `,{"type":"text","text":"` + strings.Repeat("q", 40) + `"}]}]}`
}

// An image part renders, where it stands, as ImageTokens placeholders; the
// render function gives the tokens /tokenize returns and features whose
// hash is the uuid, or the content hash of the url without one.
func TestImagePartsRender(t *testing.T) {
	hs, srv := newMediaServer(t, 20)
	for _, uuid := range []string{"", "my-image-1"} {
		body := imageChat("https://example.com/cat.png", uuid)
		toks, f, err := srv.RenderChat([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		prefix := Tokenize("<|system|>\n" + strings.Repeat("s", 40) + "<|end|>\n<|user|>\nlook:\n")
		if !slices.Equal(toks[:len(prefix)], prefix) {
			t.Fatalf("the text before the image differs")
		}
		wantID := uuid
		if uuid == "" {
			h := sha256.Sum256([]byte(testModel + "\x00https://example.com/cat.png"))
			wantID = hex.EncodeToString(h[:])
		}
		want := &Features{MMHashes: map[string][]string{"image": {wantID}},
			MMPlaceholders: map[string][]PlaceholderRange{"image": {{Offset: len(prefix), Length: 20}}}}
		if !reflect.DeepEqual(f, want) {
			t.Fatalf("features %+v, want %+v", f, want)
		}
		for i := len(prefix); i < len(prefix)+20; i++ {
			if toks[i] != ImageToken {
				t.Fatalf("token %d is %d, want the placeholder", i, toks[i])
			}
		}
		var tr tokenizeReply
		status, out := post(t, hs, "/tokenize", strings.Replace(body, `"max_tokens":1,`, "", 1))
		if status != http.StatusOK || json.Unmarshal([]byte(out), &tr) != nil || !slices.Equal(tr.Tokens, toks) {
			t.Fatalf("/tokenize: %d %s", status, out)
		}
	}
}

// Two images under the same text share the cached blocks before the image
// and none after it; the same image again is served from cache past it.
func TestDifferentImagesDoNotShareBlocks(t *testing.T) {
	hs, srv := newMediaServer(t, 40)
	cached := func(body string) int {
		t.Helper()
		status, out := post(t, hs, "/v1/chat/completions", body)
		var r chatReply
		if status != http.StatusOK || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("%d %s", status, out)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	cat, dog := imageChat("https://example.com/cat.png", ""), imageChat("https://example.com/dog.png", "")
	_, f, _ := srv.RenderChat([]byte(cat))
	before := f.MMPlaceholders["image"][0].Offset / 16 * 16
	if n := cached(cat); n != 0 {
		t.Fatalf("first: cached %d", n)
	}
	if n := cached(dog); n != before {
		t.Fatalf("another image: cached %d tokens, want %d (the blocks before the image)", n, before)
	}
	if n := cached(cat); n <= before+40 {
		t.Fatalf("the same image again: cached %d tokens, want past the image (%d)", n, before+40)
	}
}

// A text that contains the placeholder, or an image part without url or
// uuid, is refused as vLLM refuses them.
func TestBadImageParts(t *testing.T) {
	hs, _ := newMediaServer(t, 8)
	for _, body := range []string{
		`{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"text","text":"<|image_pad|>"}]}]}`,
		`{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":""}}]}]}`,
	} {
		if status, out := post(t, hs, "/v1/chat/completions", body); status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", body, status, out)
		}
		if status, out := post(t, hs, "/tokenize", body); status != http.StatusBadRequest {
			t.Errorf("tokenize %s: %d %s", body, status, out)
		}
	}
}
