package vllm

import (
	"errors"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

// stored builds a positional BlockStored with block size 4.
func storedEv(parent any, hashes []uint64, tokens []uint32, extra ...any) []any {
	ev := []any{"BlockStored", u64s(hashes...), parent, toks(tokens...), 4, nil, "GPU"}
	return append(ev, extra...)
}

func convert(t *testing.T, c *Converter, events ...any) ([]kvevents.Event, error) {
	t.Helper()
	var vb Batch
	if err := DecodeBatch(mp(t, []any{0.0, events, 0}), &vb); err != nil {
		t.Fatal(err)
	}
	evs, err := c.Convert(&vb, nil)
	// Copy: the result aliases buffers reused by the next call.
	out := make([]kvevents.Event, len(evs))
	for i, e := range evs {
		e.Blocks = append([]kvevents.StoredBlock(nil), e.Blocks...)
		e.Removed = append([]kvevents.EngineHash(nil), e.Removed...)
		out[i] = e
	}
	return out, err
}

func TestConverterChainsAcrossBatches(t *testing.T) {
	c, _ := NewConverter(ConverterConfig{BlockSize: 4})
	// The vector's two blocks, first as one event, must equal the same
	// blocks stored one per batch with the second naming the first as parent.
	whole := kvevents.SeqHashes(nil, vecTokens, 4, kvevents.HashSeed)
	evs, err := convert(t, c, storedEv(nil, []uint64{1}, vecTokens[:4]))
	if err != nil || evs[0].Blocks[0].Seq != whole[0] {
		t.Fatalf("first block: %+v, %v", evs, err)
	}
	evs, err = convert(t, c, storedEv(uint64(1), []uint64{2}, vecTokens[4:]))
	if err != nil {
		t.Fatal(err)
	}
	if got := evs[0]; got.Blocks[0] != (kvevents.StoredBlock{Engine: 2, Seq: whole[1]}) || !got.HasParent || got.Parent != 1 {
		t.Fatalf("child block: %+v, want seq %x", got, whole[1])
	}
	if whole[1] != vecSeq1 {
		t.Fatalf("chain %x != literal %x", whole[1], vecSeq1)
	}
}

func TestConverterUnknownParent(t *testing.T) {
	c, _ := NewConverter(ConverterConfig{BlockSize: 4})
	evs, err := convert(t, c,
		storedEv(uint64(99), []uint64{1}, vecTokens[:4]),
		[]any{"BlockRemoved", u64s(5)},
	)
	if !errors.Is(err, ErrUnknownParent) {
		t.Fatalf("error %v, want ErrUnknownParent", err)
	}
	if len(evs) != 1 || evs[0].Kind != kvevents.KindRemoved {
		t.Fatalf("the good event must still be returned: %+v", evs)
	}
	// The skipped block is unknown too, so its child is unresolvable.
	if _, err := convert(t, c, storedEv(uint64(1), []uint64{2}, vecTokens[4:])); !errors.Is(err, ErrUnknownParent) {
		t.Fatalf("child of a skipped block: error %v", err)
	}
	if st := c.Stats(); st.UnknownParent != 2 || st.Events != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// The converter never drops a removal or a clear it decoded: not after a
// stored event it skipped (token count, block size, unknown parent), not
// for hashes it never saw stored. Only the skipped stores are missing (an
// under-count); an unknown event type is the one skip that may hide a
// removal, which the bridge answers with a resync.
func TestConverterKeepsRemovalsAfterSkippedStores(t *testing.T) {
	c, _ := NewConverter(ConverterConfig{BlockSize: 4})
	if _, err := convert(t, c, storedEv(nil, []uint64{1}, vecTokens[:4])); err != nil {
		t.Fatal(err)
	}
	evs, err := convert(t, c,
		storedEv(nil, []uint64{2}, vecTokens), // 8 tokens for one block of 4
		omap{{"type", "BlockStored"}, {"block_hashes", u64s(4)}, {"token_ids", toks(vecTokens...)}, {"block_size", 8}},
		[]any{"BlockRemoved", u64s(2, 1, 4, 77)},
		storedEv(uint64(99), []uint64{3}, vecTokens[:4]),
		[]any{"AllBlocksCleared"},
	)
	if !errors.Is(err, ErrTokenCount) {
		t.Fatalf("error %v, want ErrTokenCount first", err)
	}
	if len(evs) != 2 || evs[0].Kind != kvevents.KindRemoved || len(evs[0].Removed) != 4 || evs[1].Kind != kvevents.KindCleared {
		t.Fatalf("got %+v, want the removal of all 4 hashes and the clear", evs)
	}
	if st := c.Stats(); st.TokenCount != 1 || st.BlockSizeError != 1 || st.UnknownParent != 1 || c.Tracked() != 0 {
		t.Fatalf("stats %+v, tracked %d", st, c.Tracked())
	}
}

func TestConverterRejects(t *testing.T) {
	c, _ := NewConverter(ConverterConfig{BlockSize: 16})
	if _, err := convert(t, c, storedEv(nil, []uint64{1, 2}, vecTokens)); !errors.Is(err, ErrBlockSizeMismatch) {
		t.Fatalf("error %v, want ErrBlockSizeMismatch", err)
	}
	c4, _ := NewConverter(ConverterConfig{BlockSize: 4})
	if _, err := convert(t, c4, storedEv(nil, []uint64{1}, vecTokens)); !errors.Is(err, ErrTokenCount) {
		t.Fatalf("error %v, want ErrTokenCount", err)
	}
	if _, err := NewConverter(ConverterConfig{}); err == nil {
		t.Fatal("NewConverter accepted block size 0")
	}
	// Skipped, not errors: remote, non-full-attention and unknown events.
	evs, err := convert(t, c4,
		omap{{"type", "BlockStored"}, {"block_hashes", u64s(1)}, {"token_ids", toks(vecTokens[:4]...)}, {"block_size", 4}, {"locality", "REMOTE"}},
		storedEv(nil, []uint64{1}, vecTokens[:4], nil, []any{nil}, 1, "sliding_window", 128),
		[]any{"SomethingNew"},
	)
	if err != nil || len(evs) != 0 {
		t.Fatalf("got %+v, %v", evs, err)
	}
	if st := c4.Stats(); st.SkippedRemote != 1 || st.SkippedGroup != 1 || st.UnknownTag != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConverterSeedsAndTiers(t *testing.T) {
	c, _ := NewConverter(ConverterConfig{BlockSize: 4})
	seed := kvevents.SeedFor("ad", "salty")
	want := kvevents.SeqHashes(nil, vecTokens, 4, seed)
	root := omap{{"type", "BlockStored"}, {"block_hashes", u64s(1)}, {"parent_block_hash", nil},
		{"token_ids", toks(vecTokens[:4]...)}, {"block_size", 4}, {"lora_name", "ad"},
		{"extra_keys", []any{[]any{"ad", "salty"}}}}
	evs, err := convert(t, c, root)
	if err != nil || evs[0].Blocks[0].Seq != want[0] {
		t.Fatalf("salted root: %+v %v, want %x", evs, err, want[0])
	}
	// The child carries only the LoRA name (vLLM puts the salt on the first
	// block only): it inherits the salted seed from its parent.
	child := omap{{"type", "BlockStored"}, {"block_hashes", u64s(2)}, {"parent_block_hash", uint64(1)},
		{"token_ids", toks(vecTokens[4:]...)}, {"block_size", 4}, {"lora_name", "ad"}, {"medium", "CPU"}}
	evs, err = convert(t, c, child)
	if err != nil || evs[0].Blocks[0].Seq != want[1] || evs[0].Tier != kvevents.TierHost {
		t.Fatalf("salted child: %+v %v, want %x", evs, err, want[1])
	}
	// Block 1 is now in GPU and CPU tiers... only CPU in fact; block 2 in CPU.
	// Removing block 2 from GPU keeps it (it is on CPU); removing it from
	// CPU forgets it; a clear forgets everything.
	if _, err := convert(t, c, []any{"BlockRemoved", u64s(2), "GPU"}); err != nil || c.Tracked() != 2 {
		t.Fatalf("tracked %d after removing a GPU copy that does not exist", c.Tracked())
	}
	if _, err := convert(t, c, []any{"BlockRemoved", u64s(2), "CPU"}); err != nil || c.Tracked() != 1 {
		t.Fatalf("tracked %d after removing the CPU copy", c.Tracked())
	}
	evs, _ = convert(t, c, []any{"AllBlocksCleared"})
	if len(evs) != 1 || evs[0].Kind != kvevents.KindCleared || c.Tracked() != 0 {
		t.Fatalf("clear: %+v, tracked %d", evs, c.Tracked())
	}
}

func TestConverterTableBound(t *testing.T) {
	c, _ := NewConverter(ConverterConfig{BlockSize: 4, MaxTracked: 3})
	for i := 0; i < 4; i++ {
		if _, err := convert(t, c, storedEv(nil, []uint64{uint64(i + 1)}, vecTokens[:4])); err != nil {
			t.Fatal(err)
		}
	}
	if c.Tracked() > 3 || c.Stats().TableResets != 1 {
		t.Fatalf("tracked %d resets %d", c.Tracked(), c.Stats().TableResets)
	}
}
