package sim

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

// imagePrompt is 96 tokens: 20 of text, 40 equal placeholders (the image),
// 36 of text.
func imagePrompt() []uint32 {
	p := seq(1, 96)
	for i := 20; i < 60; i++ {
		p[i] = 9999
	}
	return p
}

// The engine keys its cache with the images' identifiers: the same
// placeholder tokens with another image are served from cache only up to
// the block the image starts in, with the same image entirely; the cache
// holds the hashes the router computes for the same items.
func TestEngineCachesMediaByIdentifier(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{})
	run := func(id string) Result {
		st := submit(t, e, Request{Tokens: imagePrompt(), MaxTokens: 1, Media: []kvevents.MediaItem{{ID: id, Offset: 20, Length: 40}}})
		runIdle(t, e)
		return result(t, st)
	}
	if res := run("cat"); res.CachedTokens != 0 {
		t.Fatalf("first: cached %d", res.CachedTokens)
	}
	if res := run("dog"); res.CachedTokens != 16 {
		t.Fatalf("another image: cached %d tokens, want 16 (the block before the image)", res.CachedTokens)
	}
	if res := run("cat"); res.CachedTokens != 80 {
		t.Fatalf("the same image: cached %d tokens, want 80 (all but the last block, which vLLM recomputes)", res.CachedTokens)
	}
	key := e.Keys()[0]
	held := map[kvevents.SeqHash]bool{}
	for _, h := range e.Dump()[key] {
		held[h] = true
	}
	for _, id := range []string{"cat", "dog"} {
		for i, h := range kvevents.SeqHashesMedia(nil, imagePrompt(), 16, kvevents.HashSeed, []kvevents.MediaItem{{ID: id, Offset: 20, Length: 40}}) {
			if !held[h] {
				t.Fatalf("%s: block %d's router hash is not cached", id, i)
			}
		}
	}
	_, err := e.Submit(context.Background(), Request{Tokens: imagePrompt(), MaxTokens: 1, Media: []kvevents.MediaItem{{Offset: 20, Length: 40}}})
	if !errors.Is(err, ErrBadMedia) {
		t.Fatalf("an item without identifier: %v", err)
	}
	_, err = e.Submit(context.Background(), Request{Tokens: imagePrompt(), MaxTokens: 1, Media: []kvevents.MediaItem{{ID: "x", Offset: 90, Length: 40}}})
	if !errors.Is(err, ErrBadMedia) {
		t.Fatalf("an item past the prompt: %v", err)
	}
}

// The vLLM events of a request with an image carry its (identifier,
// offset) pairs in extra_keys, per block, as vLLM publishes them, and the
// view a converter builds from them equals the engine's cache.
func TestVLLMEventsMedia(t *testing.T) {
	v := newVLLMEvents(t, vllmTestConfig(100), 1)
	e, _, _ := newTestEngine(t, Config{NewEmitter: v.Factory()})
	p := v.Publisher(0)
	f := newFollower(t, e.Keys()[0], p, newMirror(t))
	waitSubscribed(t, p)
	items := []kvevents.MediaItem{{ID: "cat", Offset: 20, Length: 40}}
	for _, id := range []string{"cat", "dog"} {
		submit(t, e, Request{Tokens: imagePrompt(), MaxTokens: 1, Media: []kvevents.MediaItem{{ID: id, Offset: 20, Length: 40}}})
		runIdle(t, e)
	}
	f.catchUp(p)
	key := e.Keys()[0]
	if got, want := f.m.seqs(key), e.Dump()[key]; !slices.Equal(got, want) || len(want) != 6+5 {
		t.Fatalf("view %d blocks, engine %d (want 6 + 5: the second image shares the first block)", len(got), len(want))
	}
	res, err := vllmzmq.Replay(context.Background(), p.ReplayEndpoint(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var vb vllm.Batch
	if err := vllm.DecodeBatch(res.Batches[0].Payload, &vb); err != nil {
		t.Fatal(err)
	}
	ev := vb.Events[0]
	if want := kvevents.AppendMediaKeys(nil, items, 0, 6, 16); ev.Kind != kvevents.KindStored || !slices.Equal(ev.Media, want) {
		t.Fatalf("first stored event's pairs %+v, want %+v", ev.Media, want)
	}
}
