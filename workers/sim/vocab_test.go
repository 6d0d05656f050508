package sim

import (
	"context"
	"slices"
	"testing"
)

// A request with a Vocab generates only tokens of it, and resending prompt
// plus output hits every full block the first turn cached, output included.
func TestVocabBoundsOutputAndNextTurnHitsReplyBlocks(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{BlockSize: 4, KVBlocks: 64})
	vocab := []uint32{'a', 'b', 'c', ' '}
	prompt := seq(1000, 8)
	st := submit(t, e, Request{ID: "turn1", Tokens: prompt, MaxTokens: 9, Vocab: vocab})
	runIdle(t, e)
	var out []uint32
	for {
		ch, err := st.Recv(context.Background())
		if err != nil {
			break
		}
		out = append(out, ch.Tokens...)
	}
	if len(out) != 9 {
		t.Fatalf("got %d output tokens, want 9", len(out))
	}
	for i, tok := range out {
		if !slices.Contains(vocab, tok) {
			t.Fatalf("output token %d = %d is not in the vocabulary %v", i, tok, vocab)
		}
	}
	// Prompt 8 + 8 fed-back outputs = 16 tokens = 4 full blocks cached; the
	// next turn's 3 leading blocks hit (the last token is always computed).
	next := cat(prompt, out, seq(2000, 4))
	st2 := submit(t, e, Request{ID: "turn2", Tokens: next, MaxTokens: 1, Vocab: vocab})
	runIdle(t, e)
	if got := result(t, st2).CachedTokens; got != 16 {
		t.Fatalf("second turn cached %d tokens, want 16 (prompt and reply blocks)", got)
	}
}
