package sim

import (
	"context"
	"testing"
)

// BenchmarkDecodeStep measures one engine step with 256 requests decoding
// (schedule + complete: the simulator's hot path), streams drained as a
// client would.
func BenchmarkDecodeStep(b *testing.B) {
	e, _, _ := newTestEngine(b, Config{KVBlocks: 1 << 16, NewEmitter: func(uint32, uint64) (EventEmitter, error) { return DiscardEmitter{}, nil }})
	c := e.ranks[0]
	ctx := context.Background()
	var sts []*Stream
	bufs := make([][]uint32, 256)
	fill := func() {
		sts = sts[:0]
		for i := 0; i < 256; i++ {
			sts = append(sts, submit(b, e, Request{Tokens: seq(i*10000, 1000), MaxTokens: 3000}))
		}
		for e.ranks[0].load().PrefillTokens > 0 {
			if _, err := c.stepOnce(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	fill()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := c.stepOnce(ctx); err != nil {
			b.Fatal(err)
		}
		if i%64 == 63 {
			for j, st := range sts {
				ch, err := st.RecvInto(ctx, bufs[j])
				if err != nil {
					b.Fatal(err)
				}
				bufs[j] = ch.Tokens
			}
		}
		if e.InFlight() == 0 {
			b.StopTimer()
			fill()
			b.StartTimer()
		}
	}
}

// BenchmarkPrefillStep measures steps that admit and prefill fresh
// 2,000-token prompts (hashing, cache lookups, allocation, Stored events,
// evictions once the cache is full).
func BenchmarkPrefillStep(b *testing.B) {
	e, _, _ := newTestEngine(b, Config{KVBlocks: 4096, NewEmitter: func(uint32, uint64) (EventEmitter, error) { return DiscardEmitter{}, nil }})
	c := e.ranks[0]
	ctx := context.Background()
	prompt := seq(0, 2000)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		prompt[0] = uint32(i) // a new prefix each time
		st := submit(b, e, Request{ID: "p", Tokens: prompt, MaxTokens: 1})
		if _, err := c.stepOnce(ctx); err != nil {
			b.Fatal(err)
		}
		if _, ok := st.Result(); !ok {
			b.Fatal("not done in one step")
		}
	}
}
