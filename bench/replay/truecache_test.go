package replay

import (
	"context"
	"testing"

	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/kvevents"
)

type mapProbe map[string]int

func (m mapProbe) CachedPrefix(_ []kvevents.SeqHash, out map[string]int) {
	for w, n := range m {
		out[w] = n
	}
}

type mapLoads map[string]LoadSample

func (m mapLoads) Loads(_ context.Context, out map[string]LoadSample) error {
	for w, l := range m {
		out[w] = l
	}
	return nil
}

func trueCacheReq(blocks int) *prepared {
	hs := make([]kvevents.SeqHash, blocks)
	for i := range hs {
		hs[i] = kvevents.SeqHash(i + 1)
	}
	return &prepared{req: &workload.Request{ID: "r", InputLength: blocks * 16}, hashes: hs, promptBlocks: blocks, outputTokens: 16, maxTokens: 16}
}

func TestTrueCachePicks(t *testing.T) {
	ws := []string{"a", "b", "c"}
	ctx := context.Background()

	// The true cache wins on an idle fleet.
	o := newTrueCache(mapProbe{"b": 6}, nil, ws, 16, 1, 0, 0)
	p := trueCacheReq(8)
	bk := o.pick(ctx, p)
	if bk.worker != "b" || bk.prefill != 2*16 {
		t.Fatalf("picked %+v", bk)
	}
	// It books decode blocks for max_tokens, as a router does, not for the
	// request's own output length.
	long := trueCacheReq(8)
	long.maxTokens, long.outputTokens = 160, 16
	if bk := newTrueCache(mapProbe{}, nil, ws, 16, 1, 0, 0).pick(ctx, long); bk.blocks != 8+10 {
		t.Fatalf("booked %d blocks, want 8 prompt + 10 for max_tokens 160", bk.blocks)
	}
	// Once the first request is past its prefill, an identical second one
	// sees its blocks as in flight on that worker before the cache (here
	// empty: the probe lags) has them.
	o2 := newTrueCache(mapProbe{}, nil, ws, 16, 1, 0, 0)
	first := o2.pick(ctx, p)
	o2.prefillDone(first)
	second := o2.pick(ctx, p)
	if first.worker != second.worker {
		t.Fatalf("in-flight prefix ignored: %s then %s", first.worker, second.worker)
	}
	o2.free(first)
	o2.free(second)
	for _, w := range ws {
		if l := o2.load[w]; l.prefillTokens != 0 || l.blocks != 0 || len(l.inflight) != 0 {
			t.Fatalf("%s: books not balanced: %+v", w, l)
		}
	}

	// With the router's load view, a heavily loaded cached worker loses to
	// an idle one, and busy workers are skipped while another is free.
	o3 := newTrueCache(mapProbe{"a": 8}, mapLoads{"a": {PrefillTokens: 100000, DecodeBlocks: 5000}}, ws, 16, 1, 0, 0)
	if bk := o3.pick(ctx, trueCacheReq(8)); bk.worker == "a" {
		t.Fatal("load term ignored")
	}
	o4 := newTrueCache(mapProbe{"a": 8}, mapLoads{"a": {PrefillTokens: 9000}}, ws, 16, 1, 8192, 1000)
	if bk := o4.pick(ctx, trueCacheReq(8)); bk.worker == "a" {
		t.Fatal("busy worker chosen while others are free")
	}
	o5 := newTrueCache(mapProbe{"a": 8}, mapLoads{"a": {PrefillTokens: 9000}, "b": {PrefillTokens: 9000}, "c": {PrefillTokens: 9000}}, ws, 16, 1, 8192, 1000)
	if bk := o5.pick(ctx, trueCacheReq(8)); bk.worker != "a" {
		t.Fatalf("all busy: want the cached worker, got %s", bk.worker)
	}
}
