package kvevents

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// omap is an ordered msgpack map for building test payloads byte-exactly.
type omap []kv
type kv struct {
	k string
	v any
}

// mp encodes v: omap as a map in the given key order, []any as an array,
// anything else through msgpack.Encoder (uint64 -> cf, int64 < 0 -> d3).
func mp(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	var walk func(v any) error
	walk = func(v any) error {
		switch x := v.(type) {
		case omap:
			if err := enc.EncodeMapLen(len(x)); err != nil {
				return err
			}
			for _, e := range x {
				if err := enc.EncodeString(e.k); err != nil {
					return err
				}
				if err := walk(e.v); err != nil {
					return err
				}
			}
			return nil
		case []any:
			if err := enc.EncodeArrayLen(len(x)); err != nil {
				return err
			}
			for _, e := range x {
				if err := walk(e); err != nil {
					return err
				}
			}
			return nil
		}
		return enc.Encode(v)
	}
	if err := walk(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func u64s(hs ...uint64) []any {
	out := make([]any, len(hs))
	for i, h := range hs {
		out[i] = h
	}
	return out
}

func toks(ts ...uint32) []any {
	out := make([]any, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

var vecTokens = []uint32{1, 127, 128, 255, 256, 65535, 65536, 151644}

const (
	vecHash0 = EngineHash(0xf1e2d3c4b5a69788)
	vecHash1 = EngineHash(0x0123456789abcdef)
	vecSeq0  = SeqHash(0x070bdbe0426ed786) // literals from hash_test.go (reference XXH3)
	vecSeq1  = SeqHash(0xc7084a6d8efef81c)
)

// TestVLLMVectors decodes the three shared vectors and checks every field
// their README states, then converts them.
func TestVLLMVectors(t *testing.T) {
	vecs := loadVLLMVectors(t)
	for _, name := range vllmVectorFiles {
		t.Run(name, func(t *testing.T) {
			full := name != "vllm_kvbatch_C_positional_v0.10.bin" // A and B carry the later fields
			var vb VLLMBatch
			if err := DecodeVLLMBatch(vecs[name], &vb); err != nil {
				t.Fatal(err)
			}
			if vb.TS != 1700000000.5 || !vb.HasDPRank || vb.DPRank != 0 || len(vb.Events) != 2 {
				t.Fatalf("envelope: ts %v dp %v/%v events %d", vb.TS, vb.DPRank, vb.HasDPRank, len(vb.Events))
			}
			st := vb.Events[0]
			want := VLLMEvent{
				Kind: KindStored, BlockHashes: []EngineHash{vecHash0, vecHash1}, TokenIDs: vecTokens,
				BlockSize: 4, Medium: "GPU", Tier: TierDevice,
			}
			if full {
				want.HasExtraKeys, want.ExtraKeyCount = true, 2
				want.HasGroupIdx, want.GroupIdx = true, 0
				want.SpecKind = "full_attention"
			}
			if !reflect.DeepEqual(st, want) {
				t.Fatalf("BlockStored:\n got %+v\nwant %+v", st, want)
			}
			rm := vb.Events[1]
			wantRm := VLLMEvent{Kind: KindRemoved, BlockHashes: []EngineHash{vecHash1}, Medium: "GPU", Tier: TierDevice}
			if full {
				wantRm.HasGroupIdx = true
			}
			if !reflect.DeepEqual(rm, wantRm) {
				t.Fatalf("BlockRemoved:\n got %+v\nwant %+v", rm, wantRm)
			}

			conv, err := NewConverter(ConverterConfig{BlockSize: 4})
			if err != nil {
				t.Fatal(err)
			}
			evs, err := conv.Convert(&vb, nil)
			if err != nil {
				t.Fatal(err)
			}
			wantEvs := []Event{
				{Kind: KindStored, Tier: TierDevice, Blocks: []StoredBlock{{vecHash0, vecSeq0}, {vecHash1, vecSeq1}}},
				{Kind: KindRemoved, Tier: TierDevice, Removed: []EngineHash{vecHash1}},
			}
			if !reflect.DeepEqual(evs, wantEvs) {
				t.Fatalf("converted:\n got %+v\nwant %+v", evs, wantEvs)
			}
			if conv.Tracked() != 1 {
				t.Fatalf("after storing 2 and removing 1, converter tracks %d blocks", conv.Tracked())
			}
		})
	}
}

// TestVLLMVectorsTruncated: every strict prefix of every vector fails with a
// typed error and never panics.
func TestVLLMVectorsTruncated(t *testing.T) {
	vecs := loadVLLMVectors(t)
	var vb VLLMBatch
	for name, data := range vecs {
		for n := 0; n < len(data); n++ {
			err := DecodeVLLMBatch(data[:n], &vb)
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("%s prefix %d: error %v", name, n, err)
			}
			if len(vb.Events) != 0 {
				t.Fatalf("%s prefix %d: events left after error", name, n)
			}
		}
	}
}

func storedMap(extra ...kv) omap {
	m := omap{
		{"type", "BlockStored"},
		{"block_hashes", u64s(uint64(vecHash0), uint64(vecHash1))},
		{"parent_block_hash", nil},
		{"token_ids", toks(vecTokens...)},
		{"block_size", 4},
		{"lora_id", nil},
		{"medium", "GPU"},
		{"lora_name", nil},
	}
	return append(m, extra...)
}

func TestDecodeVLLMShapes(t *testing.T) {
	h0, h1 := uint64(vecHash0), uint64(vecHash1)
	stored12 := []any{"BlockStored", u64s(h0, h1), nil, toks(vecTokens...), 4, nil, "GPU", nil, []any{nil, nil}, 0, "full_attention", nil}
	sha := bytes.Repeat([]byte{0xaa}, 24)
	sha = append(sha, 0xf1, 0xe2, 0xd3, 0xc4, 0xb5, 0xa6, 0x97, 0x88)
	tests := []struct {
		name   string
		in     any
		check  func(t *testing.T, vb *VLLMBatch)
		hashes []EngineHash
	}{
		{name: "2-element envelope", in: []any{1.5, []any{stored12}},
			check: func(t *testing.T, vb *VLLMBatch) {
				if vb.HasDPRank || vb.TS != 1.5 {
					t.Fatalf("ts %v dp %v", vb.TS, vb.HasDPRank)
				}
			}},
		{name: "4-element envelope with nil rank", in: []any{1.5, []any{stored12}, nil, "future"},
			check: func(t *testing.T, vb *VLLMBatch) {
				if vb.HasDPRank {
					t.Fatal("nil rank decoded as present")
				}
			}},
		{name: "map envelope, any key order, unknown key", in: omap{{"data_parallel_rank", 3}, {"extra", omap{{"x", []any{1, 2}}}}, {"events", []any{stored12}}, {"ts", 2.0}},
			check: func(t *testing.T, vb *VLLMBatch) {
				if vb.DPRank != 3 || !vb.HasDPRank || vb.TS != 2 {
					t.Fatalf("dp %d ts %v", vb.DPRank, vb.TS)
				}
			}},
		{name: "v0.9.0 6-field BlockStored", in: []any{0.0, []any{[]any{"BlockStored", u64s(h0, h1), nil, toks(vecTokens...), 4, nil}}, 0},
			hashes: []EngineHash{vecHash0, vecHash1}},
		{name: "5-field BlockStored without lora_id", in: []any{0.0, []any{[]any{"BlockStored", u64s(h0, h1), nil, toks(vecTokens...), 4}}, 0},
			hashes: []EngineHash{vecHash0, vecHash1}},
		{name: "13-field BlockStored ignores the extra position", in: []any{0.0, []any{append(append([]any{}, stored12...), omap{{"new", 1}})}, 0},
			hashes: []EngineHash{vecHash0, vecHash1}},
		{name: "negative int64 hashes", in: []any{0.0, []any{[]any{"BlockStored", []any{int64(-1), int64(-0x0e1d2c3b4a596878)}, nil, toks(vecTokens...), 4, nil, "GPU"}}, 0},
			hashes: []EngineHash{0xffffffffffffffff, vecHash0}},
		{name: "bytes hashes (32 B sha256, 8 B, short)", in: []any{0.0, []any{[]any{"BlockStored", []any{sha, []byte{1, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}}, []byte{0x01, 0x02}, toks(vecTokens...), 4, nil, "GPU"}}, 0},
			hashes: []EngineHash{vecHash0, vecHash1},
			check: func(t *testing.T, vb *VLLMBatch) {
				if !vb.Events[0].HasParent || vb.Events[0].Parent != 0x0102 {
					t.Fatalf("parent %#x", vb.Events[0].Parent)
				}
			}},
		{name: "small int hashes", in: []any{0.0, []any{[]any{"BlockRemoved", []any{uint8(5), uint16(300)}}}, 0},
			hashes: []EngineHash{5, 300}},
		{name: "map event, shuffled keys, unknown keys", in: []any{0.0, []any{omap{
			{"token_ids", toks(vecTokens...)}, {"locality", "LOCAL"}, {"block_size", 4}, {"ownership", omap{{"a", nil}}},
			{"block_hashes", u64s(h0, h1)}, {"type", "BlockStored"}, {"skipped_token_ids", toks(1, 2)}}}, 0},
			hashes: []EngineHash{vecHash0, vecHash1}},
		{name: "removed 2-field and cleared", in: []any{0.0, []any{[]any{"BlockRemoved", u64s(h1)}, []any{"AllBlocksCleared"}, omap{{"type", "AllBlocksCleared"}}}, 0},
			check: func(t *testing.T, vb *VLLMBatch) {
				if len(vb.Events) != 3 || vb.Events[1].Kind != KindCleared || vb.Events[2].Kind != KindCleared {
					t.Fatalf("events %+v", vb.Events)
				}
			}},
		{name: "unknown tag kept as kind 0", in: []any{0.0, []any{[]any{"BlockMoved", 1, 2}}, 0},
			check: func(t *testing.T, vb *VLLMBatch) {
				if vb.Events[0].Kind != 0 || vb.Events[0].Tag != "BlockMoved" {
					t.Fatalf("event %+v", vb.Events[0])
				}
			}},
		{name: "lora name and salt in extra_keys", in: []any{0.0, []any{storedMap(kv{"lora_name", "ad"}, kv{"extra_keys", []any{[]any{"ad", []any{"mmhash", 0}, "salty"}, []any{"ad"}}})}, 0},
			check: func(t *testing.T, vb *VLLMBatch) {
				ev := vb.Events[0]
				if ev.LoraName != "ad" || ev.CacheSalt != "salty" || !ev.Multimodal || ev.ExtraKeyCount != 2 {
					t.Fatalf("event %+v", ev)
				}
			}},
		{name: "SGLang metadata cache_salt and medium", in: []any{0.0, []any{storedMap(kv{"metadata", omap{{"cache_salt", "s1"}, {"other", 1}}}, kv{"medium", "CPU_PINNED"})}, 0},
			check: func(t *testing.T, vb *VLLMBatch) {
				ev := vb.Events[0]
				if ev.CacheSalt != "s1" || ev.Tier != TierHost {
					t.Fatalf("event %+v", ev)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var vb VLLMBatch
			if err := DecodeVLLMBatch(mp(t, tt.in), &vb); err != nil {
				t.Fatal(err)
			}
			if tt.hashes != nil && !reflect.DeepEqual(vb.Events[0].BlockHashes, tt.hashes) {
				t.Fatalf("hashes %x, want %x", vb.Events[0].BlockHashes, tt.hashes)
			}
			if tt.check != nil {
				tt.check(t, &vb)
			}
		})
	}
}

func TestDecodeVLLMRejects(t *testing.T) {
	h0 := uint64(vecHash0)
	tests := []struct {
		name string
		in   any
		want error
	}{
		{"scalar", 5, ErrMalformed},
		{"1-element envelope", []any{0.0}, ErrMalformed},
		{"map envelope without events", omap{{"ts", 1.0}}, ErrMalformed},
		{"events not an array", []any{0.0, "x", 0}, ErrMalformed},
		{"short BlockStored", []any{0.0, []any{[]any{"BlockStored", u64s(h0), nil, toks(1)}}, 0}, ErrMalformed},
		{"short BlockRemoved", []any{0.0, []any{[]any{"BlockRemoved"}}, 0}, ErrMalformed},
		{"map event without type", []any{0.0, []any{omap{{"block_hashes", u64s(h0)}}}, 0}, ErrMalformed},
		{"map BlockStored without tokens", []any{0.0, []any{omap{{"type", "BlockStored"}, {"block_hashes", u64s(h0)}, {"block_size", 4}}}, 0}, ErrMalformed},
		{"negative token", []any{0.0, []any{[]any{"BlockStored", u64s(h0), nil, []any{-1, 2, 3, 4}, 4, nil}}, 0}, ErrMalformed},
		{"token over uint32", []any{0.0, []any{[]any{"BlockStored", u64s(h0), nil, []any{uint64(1 << 33), 2, 3, 4}, 4, nil}}, 0}, ErrMalformed},
		{"block size 0", []any{0.0, []any{[]any{"BlockStored", u64s(h0), nil, toks(1), 0, nil}}, 0}, ErrMalformed},
		{"hash is a string", []any{0.0, []any{[]any{"BlockRemoved", []any{"abc"}}}, 0}, ErrMalformed},
		{"tag not a string", []any{0.0, []any{[]any{7, u64s(h0)}}, 0}, ErrMalformed},
		{"duplicate block_hashes", []any{0.0, []any{omap{{"type", "BlockRemoved"}, {"block_hashes", u64s(h0)}, {"block_hashes", u64s(h0)}}}, 0}, ErrMalformed},
	}
	for _, tt := range tests {
		var vb VLLMBatch
		if err := DecodeVLLMBatch(mp(t, tt.in), &vb); !errors.Is(err, tt.want) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.want)
		}
	}
	var vb VLLMBatch
	if err := DecodeVLLMBatch(append(mp(t, []any{0.0, []any{}}), 0), &vb); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing byte: error %v", err)
	}
	if err := DecodeVLLMBatch(make([]byte, MaxVLLMBatchBytes+1), &vb); !errors.Is(err, ErrOversized) {
		t.Errorf("oversized: error %v", err)
	}
}

func TestMediumTier(t *testing.T) {
	for m, want := range map[string]Tier{"": TierDevice, "GPU": TierDevice, "gpu": TierDevice, "CPU": TierHost,
		"CPU_PINNED": TierHost, "cpu_pinned": TierHost, "DISK": TierDisk, "STORAGE": TierExternal, "EXTERNAL": TierExternal} {
		if got := mediumTier(m); got != want {
			t.Errorf("mediumTier(%q) = %v, want %v", m, got, want)
		}
	}
}

// stored builds a positional BlockStored with block size 4.
func storedEv(parent any, hashes []uint64, tokens []uint32, extra ...any) []any {
	ev := []any{"BlockStored", u64s(hashes...), parent, toks(tokens...), 4, nil, "GPU"}
	return append(ev, extra...)
}

func convert(t *testing.T, c *Converter, events ...any) ([]Event, error) {
	t.Helper()
	var vb VLLMBatch
	if err := DecodeVLLMBatch(mp(t, []any{0.0, events, 0}), &vb); err != nil {
		t.Fatal(err)
	}
	evs, err := c.Convert(&vb, nil)
	// Copy: the result aliases buffers reused by the next call.
	out := make([]Event, len(evs))
	for i, e := range evs {
		e.Blocks = append([]StoredBlock(nil), e.Blocks...)
		e.Removed = append([]EngineHash(nil), e.Removed...)
		out[i] = e
	}
	return out, err
}

func TestConverterChainsAcrossBatches(t *testing.T) {
	c, _ := NewConverter(ConverterConfig{BlockSize: 4})
	// The vector's two blocks, first as one event, must equal the same
	// blocks stored one per batch with the second naming the first as parent.
	whole := SeqHashes(nil, vecTokens, 4, HashSeed)
	evs, err := convert(t, c, storedEv(nil, []uint64{1}, vecTokens[:4]))
	if err != nil || evs[0].Blocks[0].Seq != whole[0] {
		t.Fatalf("first block: %+v, %v", evs, err)
	}
	evs, err = convert(t, c, storedEv(uint64(1), []uint64{2}, vecTokens[4:]))
	if err != nil {
		t.Fatal(err)
	}
	if got := evs[0]; got.Blocks[0] != (StoredBlock{2, whole[1]}) || !got.HasParent || got.Parent != 1 {
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
	if len(evs) != 1 || evs[0].Kind != KindRemoved {
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
	seed := SeedFor("ad", "salty")
	want := SeqHashes(nil, vecTokens, 4, seed)
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
	if err != nil || evs[0].Blocks[0].Seq != want[1] || evs[0].Tier != TierHost {
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
	if len(evs) != 1 || evs[0].Kind != KindCleared || c.Tracked() != 0 {
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

func FuzzDecodeVLLMBatch(f *testing.F) {
	vecs := loadVLLMVectors(f)
	for _, name := range vllmVectorFiles {
		f.Add(vecs[name])
	}
	f.Add(mp(f, []any{0.0, []any{storedEv(nil, []uint64{1, 2}, vecTokens)}, 0}))
	f.Add(mp(f, omap{{"events", []any{storedMap(kv{"extra_keys", []any{[]any{"s"}, nil}}), []any{"AllBlocksCleared"}}}, {"ts", 1.0}}))
	var vb VLLMBatch
	conv, _ := NewConverter(ConverterConfig{BlockSize: 4, MaxTracked: 1024})
	var out []Event
	f.Fuzz(func(t *testing.T, data []byte) {
		err := DecodeVLLMBatch(data, &vb)
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrOversized) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		out, err = conv.Convert(&vb, out[:0])
		if err != nil && !errors.Is(err, ErrUnknownParent) && !errors.Is(err, ErrBlockSizeMismatch) && !errors.Is(err, ErrTokenCount) {
			t.Fatalf("untyped convert error %v", err)
		}
		// Every stored event's blocks come from one vLLM event's hashes.
		for _, ev := range out {
			if ev.Kind == KindStored && len(ev.Blocks) > len(vb.tokens) {
				t.Fatalf("stored event with %d blocks from %d tokens", len(ev.Blocks), len(vb.tokens))
			}
		}
	})
}

// vllmStored16x16 is one BlockStored of 16 blocks x 16 tokens in the
// 12-field positional form (vLLM 0.11-0.23) or the map form (>= 0.24).
func vllmStored16x16(t testing.TB, asMap bool) []byte {
	hashes := make([]any, 16)
	tokens := make([]any, 256)
	for i := range hashes {
		hashes[i] = uint64(0x9e3779b97f4a7c15) * uint64(i+1)
	}
	for i := range tokens {
		tokens[i] = uint32(i*7919) % 151000
	}
	extra := make([]any, 16)
	var ev any = []any{"BlockStored", hashes, nil, tokens, 16, nil, "GPU", nil, extra, 0, "full_attention", nil}
	if asMap {
		ev = omap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", nil}, {"token_ids", tokens},
			{"block_size", 16}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}, {"extra_keys", extra},
			{"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"}}
	}
	return mp(t, []any{1700000000.5, []any{ev}, 0})
}

// BenchmarkVLLMStored16x16 decodes one BlockStored of 16 blocks x 16 tokens
// and converts it (hashing 16 local hashes + 15 chain steps). Target: <= 3
// µs and <= 2 allocations per op.
func BenchmarkVLLMStored16x16(b *testing.B) {
	for _, form := range []struct {
		name  string
		asMap bool
	}{{"positional", false}, {"map", true}} {
		b.Run(form.name, func(b *testing.B) {
			payload := vllmStored16x16(b, form.asMap)
			var vb VLLMBatch
			conv, _ := NewConverter(ConverterConfig{BlockSize: 16})
			var out []Event
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if err := DecodeVLLMBatch(payload, &vb); err != nil {
					b.Fatal(err)
				}
				var err error
				if out, err = conv.Convert(&vb, out[:0]); err != nil || len(out[0].Blocks) != 16 {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestVLLMStored16x16Allocs(t *testing.T) {
	payload := vllmStored16x16(t, false)
	var vb VLLMBatch
	conv, _ := NewConverter(ConverterConfig{BlockSize: 16})
	var out []Event
	run := func() {
		if err := DecodeVLLMBatch(payload, &vb); err != nil {
			t.Fatal(err)
		}
		var err error
		if out, err = conv.Convert(&vb, out[:0]); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if allocs := testing.AllocsPerRun(100, run); allocs > 2 {
		t.Fatalf("decode+convert allocated %.1f times per run, budget 2", allocs)
	}
}
