package realpath

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

const mediaImageTokens = 40 // placeholders per image: not a whole number of blocks

// turnResult is what one chat turn through the gateway told: the
// router's overlap (X-Kvr-Overlap-Blocks), the engine's usage, the worker
// and the reply.
type turnResult struct {
	overlap, cached, prompt int
	worker, content         string
}

// chatTurn posts one chat body to the gateway at gw, in session.
func (st *stack) chatTurn(gw, session string, body []byte) turnResult {
	st.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, gw+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Id", session)
	resp, err := st.http.Do(req)
	if err != nil {
		st.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		st.t.Fatalf("chat: %s: %s", resp.Status, out)
	}
	var r struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Choices) != 1 {
		st.t.Fatalf("chat reply %s: %v", out, err)
	}
	overlap, err := strconv.Atoi(resp.Header.Get(gateway.HeaderOverlapBlocks))
	if err != nil {
		st.t.Fatalf("%s: %v", gateway.HeaderOverlapBlocks, err)
	}
	return turnResult{overlap: overlap, cached: r.Usage.PromptTokensDetails.CachedTokens, prompt: r.Usage.PromptTokens,
		worker: resp.Header.Get(gateway.HeaderWorker), content: r.Choices[0].Message.Content}
}

// indexesCaughtUp waits until every replica indexes exactly the blocks
// each engine holds (no eviction in these tests: the counts say it).
func (st *stack) indexesCaughtUp() {
	st.t.Helper()
	testutil.Eventually(st.t, 10*time.Second, func() bool {
		for _, e := range st.engines {
			n := len(e.eng.Dump()[workerref.Target{Worker: e.id}])
			for _, r := range st.replicas {
				if st.indexed(r, e.id, 0) != n {
					return false
				}
			}
		}
		return true
	}, func() string { return "the indexes to catch up with the engines: " + st.workers() })
}

func imagePart(url, uuid string) map[string]any {
	p := map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}
	if uuid != "" {
		p["uuid"] = uuid
	}
	return p
}

// mediaRow is one row of the media table: sessions of turns with images.
type mediaRow struct {
	name     string
	uuid     bool // the client gives every image a uuid
	known    bool // the gateway knows the items' identifiers (render endpoint): it may match past them
	sessions int
	turns    int
}

// runMediaRow runs a row's conversations through the gateway at gw, one
// request at a time, each after the routers' indexes caught up with the
// engines (so the overlap the router predicts is the events' alone), and
// checks the invariant on every request: the predicted overlap equals the
// engine's cached_tokens in blocks. vLLM always computes a prompt's last
// token, so an overlap reaching it counts one block less; and where the
// gateway cannot know the identifiers, the router claims no block from the
// first image on. It returns how many requests the router matched past
// their first image, and how many the engine served from cache past it.
func (st *stack) runMediaRow(gw string, row mediaRow) (pastImage, cachedPast int) {
	st.t.Helper()
	// Every session: the same system prompt and question, its own image;
	// a second image of its own at turn 2.
	system := map[string]any{"role": "system", "content": longText("you describe pictures in detail", 300)}
	firstTurns, shared := 0, 0
	for s := range row.sessions {
		id := func(k int) string {
			if !row.uuid {
				return ""
			}
			return fmt.Sprintf("%s-img-%d-%d", row.name, s, k)
		}
		msgs := []any{system, map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "What is in this picture?"},
			imagePart(fmt.Sprintf("https://example.com/%s/%d.png", row.name, s), id(0)),
			map[string]any{"type": "text", "text": "Be brief."},
		}}}
		for turn := range row.turns {
			body, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs, "max_tokens": 8})
			_, f, err := st.engines[0].face.RenderChat(body)
			if err != nil {
				st.t.Fatal(err)
			}
			firstImage := f.MMPlaceholders["image"][0].Offset / testBlock
			res := st.chatTurn(gw, fmt.Sprintf("%s-%d", row.name, s), body)
			want := res.cached / testBlock
			got := min(res.overlap, (res.prompt-1)/testBlock)
			if !row.known {
				want = min(want, firstImage)
			}
			if got != want {
				st.t.Fatalf("%s session %d turn %d on %s: the router predicted %d blocks (overlap %d), the engine cached %d tokens (want %d blocks; first image in block %d)",
					row.name, s, turn, res.worker, got, res.overlap, res.cached, want, firstImage)
			}
			if res.overlap > firstImage {
				pastImage++
			}
			if res.cached/testBlock > firstImage {
				cachedPast++
			}
			if turn == 0 {
				// Another session's image, with the same placeholder
				// tokens, never matches past its start.
				if res.overlap > firstImage || res.cached/testBlock > firstImage {
					st.t.Fatalf("%s session %d: a new image matched past its start: overlap %d, cached %d, image in block %d",
						row.name, s, res.overlap, res.cached, firstImage)
				}
				firstTurns++
				if res.overlap == firstImage && firstImage > 0 {
					shared++
				}
			}
			st.indexesCaughtUp()
			next := []any{map[string]any{"type": "text", "text": "And then? " + strconv.Itoa(turn)}}
			if turn == 1 {
				next = append(next, imagePart(fmt.Sprintf("https://example.com/%s/%d-b.png", row.name, s), id(1)))
			}
			msgs = append(msgs, map[string]any{"role": "assistant", "content": res.content}, map[string]any{"role": "user", "content": next})
		}
	}
	if shared == 0 {
		st.t.Fatalf("%s: no first turn matched the shared prefix before its image (of %d): the test would not show that images keep sessions apart", row.name, firstTurns)
	}
	st.t.Logf("%s: %d requests, the router matched %d past their first image, the engine %d; %d of %d first turns matched the shared prefix up to their image",
		row.name, row.sessions*row.turns, pastImage, cachedPast, shared, firstTurns)
	return pastImage, cachedPast
}

// Images through the real path (gateway, bridges, ZMQ events with
// extra_keys, replicas), with an engine that has vLLM's render endpoint:
// the gateway hashes every item with the identifier the engine keys it
// with (the client's uuid, or the engine's content hash), so the router
// matches past images exactly as far as the engine's cache: on every
// request of both rows the predicted overlap equals cached_tokens in
// blocks, and later turns match past their images.
func TestMediaRowsWithRender(t *testing.T) {
	st := startStack(t, stackOpts{engines: 2, replicas: 2, kvBlocks: 8192, eventsOnly: true, imageTokens: mediaImageTokens})
	nc, _ := st.conn("gateway")
	gw := st.gatewayURL(gateway.ClientRouter{C: api.NewClient(nc, "", nil)})
	for _, row := range []mediaRow{
		{name: "uuid", uuid: true, known: true, sessions: 10, turns: 5},
		{name: "no-uuid", known: true, sessions: 10, turns: 5},
	} {
		if n, _ := st.runMediaRow(gw, row); n == 0 {
			t.Fatalf("%s: no request matched past its first image", row.name)
		}
	}
	st.waitIdle()
}

// The same rows with engines that have no render endpoint (vLLM before
// it): the gateway knows where the first image starts (/tokenize with and
// without the media parts) but not the engine's hashes past it, uuid or
// not, so the router claims no block from the first image on: on every
// request the predicted overlap equals cached_tokens in blocks, cut at the
// first image, and never more.
func TestMediaRowsWithoutRender(t *testing.T) {
	st := startStack(t, stackOpts{engines: 2, replicas: 2, kvBlocks: 8192, eventsOnly: true, imageTokens: mediaImageTokens,
		face: func(c *vllmapi.Config) { c.DisableRender = true }})
	nc, _ := st.conn("gateway")
	gw := st.gatewayURL(gateway.ClientRouter{C: api.NewClient(nc, "", nil)})
	for _, row := range []mediaRow{
		{name: "uuid", uuid: true, sessions: 10, turns: 5},
		{name: "no-uuid", sessions: 10, turns: 5},
	} {
		n, engine := st.runMediaRow(gw, row)
		if n != 0 || engine == 0 {
			t.Fatalf("%s: the router matched %d requests past their first image without identifiers, the engine %d (want 0 and some)", row.name, n, engine)
		}
	}
	st.waitIdle()
}
