package sim

import (
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

// A decode engine skips the prefill of transferred blocks (all but the
// last token's block), caches and publishes them, reports only its own
// cache hits as cached tokens, and names them afterwards in HeldPrefix.
func TestTransferredBlocksSkipPrefill(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{BlockSize: 16})
	prompt := seq(1, 16*10+5) // 10 full blocks and 5 tokens
	held, err := e.HeldPrefix(Request{Tokens: prompt})
	if err != nil || len(held) != 0 {
		t.Fatalf("HeldPrefix before: %v %v", held, err)
	}
	st := submit(t, e, Request{ID: "d", Tokens: prompt, MaxTokens: 2, Transferred: 10})
	runIdle(t, e)
	res := result(t, st)
	if res.Err != nil || res.CachedTokens != 0 {
		t.Fatalf("result %+v: want no local cache hits", res)
	}
	s := e.Stats()[0]
	if s.TransferredBlocks != 10 || s.PrefillTokens != 5 {
		t.Fatalf("stats %+v: want 10 transferred blocks and 5 prefill tokens", s)
	}
	stored := 0
	for _, ev := range rs.latest(0).all() {
		if ev.Kind == kvevents.KindStored {
			stored += len(ev.Blocks)
		}
	}
	if stored < 10 {
		t.Fatalf("%d blocks published as stored, want at least the 10 transferred", stored)
	}
	if held, _ := e.HeldPrefix(Request{Tokens: prompt}); len(held) != 10 {
		t.Fatalf("HeldPrefix after: %d blocks, want 10", len(held))
	}
	// A prompt that is exactly whole blocks keeps its last block to compute.
	st = submit(t, e, Request{ID: "d2", Tokens: seq(1000, 32), MaxTokens: 1, Transferred: 2})
	runIdle(t, e)
	if s := e.Stats()[0]; s.TransferredBlocks != 11 || s.PrefillTokens != 5+16 {
		t.Fatalf("stats %+v: want 1 more transferred block and 16 more prefill tokens", s)
	}
	_ = result(t, st)
}
