package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// approxOf is the pseudo-blocks of a request body of kind at block size bs.
func approxOf(t testing.TB, kind, body string, bs int) []uint64 {
	t.Helper()
	cr, rerr := readRequest(kind, []byte(body))
	if rerr != nil {
		t.Fatalf("readRequest(%s): %v", body, rerr)
	}
	text, ok := approxText(nil, kind, &cr)
	if !ok {
		t.Fatalf("no approx text for %s", body)
	}
	return approxBlocks(nil, text, bs)
}

// A conversation's next turn (and a longer completion prompt) extends the
// previous pseudo-blocks strictly; other text starts apart.
func TestApproxNextTurnExtendsBlocks(t *testing.T) {
	long := longText("tell me about caches", 300)
	msg := func(role, content string) string {
		c, _ := json.Marshal(content)
		return `{"role":"` + role + `","content":` + string(c) + `}`
	}
	chat := func(msgs ...string) string { return `{"model":"m","messages":[` + strings.Join(msgs, ",") + `]}` }
	completion := func(p string) string { c, _ := json.Marshal(p); return `{"model":"m","prompt":` + string(c) + `}` }
	cases := []struct {
		name        string
		kind        string
		turn, next  string
		other       string // a prompt that differs from turn in its first bytes
		wantBlocks1 int    // pseudo-blocks of turn at block size 16 (64 bytes each)
	}{
		{"chat", kindChat,
			chat(msg("system", "be brief"), msg("user", long)),
			chat(msg("system", "be brief"), msg("user", long), msg("assistant", longText("caches keep things", 100)), msg("user", "and then?")),
			chat(msg("system", "be long"), msg("user", long)),
			(len("system\nbe brief\nuser\n") + 300 + 1) / 64},
		{"chat content parts", kindChat,
			chat(`{"role":"user","content":[{"type":"text","text":` + strconv.Quote(long) + `},{"type":"image_url","image_url":{"url":"x"}}]}`),
			chat(msg("user", long), msg("assistant", "ok"), msg("user", long)),
			chat(msg("assistant", long)),
			(len("user\n") + 300 + 1) / 64},
		{"completion", kindCompletion, completion(long), completion(long + " and more and more text than one block of it"), completion("x" + long), 300 / 64},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b1, b2, other := approxOf(t, tc.kind, tc.turn, 16), approxOf(t, tc.kind, tc.next, 16), approxOf(t, tc.kind, tc.other, 16)
			if len(b1) != tc.wantBlocks1 {
				t.Fatalf("turn: %d pseudo-blocks, want %d", len(b1), tc.wantBlocks1)
			}
			if len(b2) <= len(b1) || !slices.Equal(b2[:len(b1)], b1) {
				t.Fatalf("next turn's %d pseudo-blocks do not strictly extend the turn's %d", len(b2), len(b1))
			}
			if len(other) == 0 || other[0] == b1[0] {
				t.Fatalf("other text shares the first pseudo-block (%d blocks)", len(other))
			}
		})
	}
}

func TestApproxBlocksEdges(t *testing.T) {
	text := []byte(longText("abc", 1000))
	cases := []struct {
		name string
		text []byte
		bs   int
		want int
	}{
		{"block size 0", text, 0, 0},
		{"shorter than a block", text[:63], 16, 0},
		{"exactly one block", text[:64], 16, 1},
		{"partial tail left out", text, 16, 1000 / 64},
		{"block size 1", text[:9], 1, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := approxBlocks(nil, tc.text, tc.bs); len(got) != tc.want {
				t.Fatalf("%d pseudo-blocks, want %d", len(got), tc.want)
			}
		})
	}
}

func TestApproxTokenizerConfig(t *testing.T) {
	_, err := New(Config{Router: ReplicaRouter{}, Models: []string{"m"}, Tokenizer: "words"})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `"words"`) {
		t.Fatalf("New with tokenizer words: %v, want ErrConfig naming it", err)
	}
}

// FuzzApproxText: any body the request reader takes gives a text and
// pseudo-blocks without panicking, one per full chunk.
func FuzzApproxText(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, true)
	f.Add(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, true)
	f.Add(`{"model":"m","messages":[{"role":"user","content":null},{"role":7}]}`, true)
	f.Add(`{"model":"m","prompt":["a","b"]}`, false)
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		kind := kindCompletion
		if chat {
			kind = kindChat
		}
		cr, rerr := readRequest(kind, []byte(body))
		if rerr != nil {
			return
		}
		text, _ := approxText(nil, kind, &cr)
		if got := approxBlocks(nil, text, 4); len(got) != len(text)/16 {
			t.Fatalf("%d pseudo-blocks of %d bytes, want %d", len(got), len(text), len(text)/16)
		}
	})
}

// Through the gateway with --tokenizer approx and a replica in approximate
// mode (engines publish no events): the turns of a session-less
// conversation land on the worker of the first with overlap, and no
// /tokenize request reaches an engine. An engine-tokenizer gateway on the
// same fleet does call /tokenize (the count can fail).
func TestApproxTokenizerRoutesConversation(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 3, approximate: true})
	c := client(f.gateway(nil, func(c *Config) { c.Tokenizer = TokenizerApprox }))
	ctx := ctxT(t)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage(longText("tell me about caches", 600))}
	var first string
	for turn := range 4 {
		var hr *http.Response
		r, err := c.Chat.Completions.New(ctx, chatParams(turn%2 == 1, msgs...), option.WithResponseInto(&hr))
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		w := hr.Header.Get(HeaderWorker)
		n, _ := strconv.Atoi(hr.Header.Get(HeaderOverlapBlocks))
		switch {
		case turn == 0 && n != 0:
			t.Fatalf("turn 0 on %s with overlap %d, want 0 (nothing routed yet)", w, n)
		case turn == 0:
			first = w
		case w != first || n == 0:
			t.Fatalf("turn %d went to %s with overlap %d, want %s with overlap > 0", turn, w, n, first)
		}
		f.waitIdle()
		msgs = append(msgs, openai.AssistantMessage(r.Choices[0].Message.Content), openai.UserMessage("and then? "+strconv.Itoa(turn)))
	}
	for _, e := range f.engines {
		if n := e.tokenizeCalls.Load(); n != 0 {
			t.Errorf("engine %s got %d /tokenize requests in approx mode", e.id, n)
		}
	}

	ce := client(f.gateway(nil, nil))
	if _, err := ce.Chat.Completions.New(ctx, chatParams(false, msgs...)); err != nil {
		t.Fatal(err)
	}
	total := int64(0)
	for _, e := range f.engines {
		total += e.tokenizeCalls.Load()
	}
	if total != 1 {
		t.Errorf("engine tokenizer: %d /tokenize requests, want 1", total)
	}
	f.waitIdle()
}

// BenchmarkApproxTokenizer: the approx tokenizer on a chat prompt of a
// 2,048-token equivalent (8 KiB of text at 4 bytes per token), from the
// read request to the pseudo-blocks.
func BenchmarkApproxTokenizer(b *testing.B) {
	c, _ := json.Marshal(longText("tell me about caches", 2048*ApproxBytesPerToken-len("user\n\n")))
	body := []byte(`{"model":"m","messages":[{"role":"user","content":` + string(c) + `}]}`)
	cr, rerr := readRequest(kindChat, body)
	if rerr != nil {
		b.Fatal(rerr)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if hs, n, _ := approxHashes(kindChat, &cr, 16); len(hs) != 128 || n != 2048 {
			b.Fatalf("%d pseudo-blocks and %d input tokens, want 128 and 2048", len(hs), n)
		}
	}
}
