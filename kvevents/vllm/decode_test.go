package vllm

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

// TestVLLMVectors decodes the three shared vectors and checks every field
// their README states, then converts them.
func TestVLLMVectors(t *testing.T) {
	vecs := loadVLLMVectors(t)
	for _, name := range vllmVectorFiles {
		t.Run(name, func(t *testing.T) {
			full := name != "vllm_kvbatch_C_positional_v0.10.bin" // A and B carry the later fields
			var vb Batch
			if err := DecodeBatch(vecs[name], &vb); err != nil {
				t.Fatal(err)
			}
			if vb.TS != 1700000000.5 || !vb.HasDPRank || vb.DPRank != 0 || len(vb.Events) != 2 {
				t.Fatalf("envelope: ts %v dp %v/%v events %d", vb.TS, vb.DPRank, vb.HasDPRank, len(vb.Events))
			}
			st := vb.Events[0]
			want := Event{
				Kind: kvevents.KindStored, BlockHashes: []kvevents.EngineHash{vecHash0, vecHash1}, TokenIDs: vecTokens,
				BlockSize: 4, Medium: "GPU", Tier: kvevents.TierDevice,
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
			wantRm := Event{Kind: kvevents.KindRemoved, BlockHashes: []kvevents.EngineHash{vecHash1}, Medium: "GPU", Tier: kvevents.TierDevice}
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
			wantEvs := []kvevents.Event{
				{Kind: kvevents.KindStored, Tier: kvevents.TierDevice, Blocks: []kvevents.StoredBlock{{Engine: vecHash0, Seq: vecSeq0}, {Engine: vecHash1, Seq: vecSeq1}}},
				{Kind: kvevents.KindRemoved, Tier: kvevents.TierDevice, Removed: []kvevents.EngineHash{vecHash1}},
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
	var vb Batch
	for name, data := range vecs {
		for n := 0; n < len(data); n++ {
			err := DecodeBatch(data[:n], &vb)
			if !errors.Is(err, kvevents.ErrTruncated) && !errors.Is(err, kvevents.ErrMalformed) {
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
		check  func(t *testing.T, vb *Batch)
		hashes []kvevents.EngineHash
	}{
		{name: "2-element envelope", in: []any{1.5, []any{stored12}},
			check: func(t *testing.T, vb *Batch) {
				if vb.HasDPRank || vb.TS != 1.5 {
					t.Fatalf("ts %v dp %v", vb.TS, vb.HasDPRank)
				}
			}},
		{name: "4-element envelope with nil rank", in: []any{1.5, []any{stored12}, nil, "future"},
			check: func(t *testing.T, vb *Batch) {
				if vb.HasDPRank {
					t.Fatal("nil rank decoded as present")
				}
			}},
		{name: "map envelope, any key order, unknown key", in: omap{{"data_parallel_rank", 3}, {"extra", omap{{"x", []any{1, 2}}}}, {"events", []any{stored12}}, {"ts", 2.0}},
			check: func(t *testing.T, vb *Batch) {
				if vb.DPRank != 3 || !vb.HasDPRank || vb.TS != 2 {
					t.Fatalf("dp %d ts %v", vb.DPRank, vb.TS)
				}
			}},
		{name: "v0.9.0 6-field BlockStored", in: []any{0.0, []any{[]any{"BlockStored", u64s(h0, h1), nil, toks(vecTokens...), 4, nil}}, 0},
			hashes: []kvevents.EngineHash{vecHash0, vecHash1}},
		{name: "5-field BlockStored without lora_id", in: []any{0.0, []any{[]any{"BlockStored", u64s(h0, h1), nil, toks(vecTokens...), 4}}, 0},
			hashes: []kvevents.EngineHash{vecHash0, vecHash1}},
		{name: "13-field BlockStored ignores the extra position", in: []any{0.0, []any{append(append([]any{}, stored12...), omap{{"new", 1}})}, 0},
			hashes: []kvevents.EngineHash{vecHash0, vecHash1}},
		{name: "negative int64 hashes", in: []any{0.0, []any{[]any{"BlockStored", []any{int64(-1), int64(-0x0e1d2c3b4a596878)}, nil, toks(vecTokens...), 4, nil, "GPU"}}, 0},
			hashes: []kvevents.EngineHash{0xffffffffffffffff, vecHash0}},
		{name: "bytes hashes (32 B sha256, 8 B, short)", in: []any{0.0, []any{[]any{"BlockStored", []any{sha, []byte{1, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}}, []byte{0x01, 0x02}, toks(vecTokens...), 4, nil, "GPU"}}, 0},
			hashes: []kvevents.EngineHash{vecHash0, vecHash1},
			check: func(t *testing.T, vb *Batch) {
				if !vb.Events[0].HasParent || vb.Events[0].Parent != 0x0102 {
					t.Fatalf("parent %#x", vb.Events[0].Parent)
				}
			}},
		{name: "small int hashes", in: []any{0.0, []any{[]any{"BlockRemoved", []any{uint8(5), uint16(300)}}}, 0},
			hashes: []kvevents.EngineHash{5, 300}},
		{name: "map event, shuffled keys, unknown keys", in: []any{0.0, []any{omap{
			{"token_ids", toks(vecTokens...)}, {"locality", "LOCAL"}, {"block_size", 4}, {"ownership", omap{{"a", nil}}},
			{"block_hashes", u64s(h0, h1)}, {"type", "BlockStored"}, {"skipped_token_ids", toks(1, 2)}}}, 0},
			hashes: []kvevents.EngineHash{vecHash0, vecHash1}},
		{name: "removed 2-field and cleared", in: []any{0.0, []any{[]any{"BlockRemoved", u64s(h1)}, []any{"AllBlocksCleared"}, omap{{"type", "AllBlocksCleared"}}}, 0},
			check: func(t *testing.T, vb *Batch) {
				if len(vb.Events) != 3 || vb.Events[1].Kind != kvevents.KindCleared || vb.Events[2].Kind != kvevents.KindCleared {
					t.Fatalf("events %+v", vb.Events)
				}
			}},
		{name: "unknown tag kept as kind 0", in: []any{0.0, []any{[]any{"BlockMoved", 1, 2}}, 0},
			check: func(t *testing.T, vb *Batch) {
				if vb.Events[0].Kind != 0 || vb.Events[0].Tag != "BlockMoved" {
					t.Fatalf("event %+v", vb.Events[0])
				}
			}},
		{name: "lora name and salt in extra_keys", in: []any{0.0, []any{storedMap(kv{"lora_name", "ad"}, kv{"extra_keys", []any{[]any{"ad", []any{"mmhash", 0}, "salty"}, []any{"ad"}}})}, 0},
			check: func(t *testing.T, vb *Batch) {
				ev := vb.Events[0]
				if ev.LoraName != "ad" || ev.CacheSalt != "salty" || !ev.Multimodal || ev.ExtraKeyCount != 2 {
					t.Fatalf("event %+v", ev)
				}
			}},
		{name: "SGLang metadata cache_salt and medium", in: []any{0.0, []any{storedMap(kv{"metadata", omap{{"cache_salt", "s1"}, {"other", 1}}}, kv{"medium", "CPU_PINNED"})}, 0},
			check: func(t *testing.T, vb *Batch) {
				ev := vb.Events[0]
				if ev.CacheSalt != "s1" || ev.Tier != kvevents.TierHost {
					t.Fatalf("event %+v", ev)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var vb Batch
			if err := DecodeBatch(mp(t, tt.in), &vb); err != nil {
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
		{"scalar", 5, kvevents.ErrMalformed},
		{"1-element envelope", []any{0.0}, kvevents.ErrMalformed},
		{"map envelope without events", omap{{"ts", 1.0}}, kvevents.ErrMalformed},
		{"events not an array", []any{0.0, "x", 0}, kvevents.ErrMalformed},
		{"short BlockStored", []any{0.0, []any{[]any{"BlockStored", u64s(h0), nil, toks(1)}}, 0}, kvevents.ErrMalformed},
		{"short BlockRemoved", []any{0.0, []any{[]any{"BlockRemoved"}}, 0}, kvevents.ErrMalformed},
		{"map event without type", []any{0.0, []any{omap{{"block_hashes", u64s(h0)}}}, 0}, kvevents.ErrMalformed},
		{"map BlockStored without tokens", []any{0.0, []any{omap{{"type", "BlockStored"}, {"block_hashes", u64s(h0)}, {"block_size", 4}}}, 0}, kvevents.ErrMalformed},
		{"negative token", []any{0.0, []any{[]any{"BlockStored", u64s(h0), nil, []any{-1, 2, 3, 4}, 4, nil}}, 0}, kvevents.ErrMalformed},
		{"token over uint32", []any{0.0, []any{[]any{"BlockStored", u64s(h0), nil, []any{uint64(1 << 33), 2, 3, 4}, 4, nil}}, 0}, kvevents.ErrMalformed},
		{"block size 0", []any{0.0, []any{[]any{"BlockStored", u64s(h0), nil, toks(1), 0, nil}}, 0}, kvevents.ErrMalformed},
		{"hash is a string", []any{0.0, []any{[]any{"BlockRemoved", []any{"abc"}}}, 0}, kvevents.ErrMalformed},
		{"tag not a string", []any{0.0, []any{[]any{7, u64s(h0)}}, 0}, kvevents.ErrMalformed},
		{"duplicate block_hashes", []any{0.0, []any{omap{{"type", "BlockRemoved"}, {"block_hashes", u64s(h0)}, {"block_hashes", u64s(h0)}}}, 0}, kvevents.ErrMalformed},
	}
	for _, tt := range tests {
		var vb Batch
		if err := DecodeBatch(mp(t, tt.in), &vb); !errors.Is(err, tt.want) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.want)
		}
	}
	var vb Batch
	if err := DecodeBatch(append(mp(t, []any{0.0, []any{}}), 0), &vb); !errors.Is(err, kvevents.ErrMalformed) {
		t.Errorf("trailing byte: error %v", err)
	}
	if err := DecodeBatch(make([]byte, MaxBatchBytes+1), &vb); !errors.Is(err, kvevents.ErrOversized) {
		t.Errorf("oversized: error %v", err)
	}
}

func TestMediumTier(t *testing.T) {
	for m, want := range map[string]kvevents.Tier{"": kvevents.TierDevice, "GPU": kvevents.TierDevice, "gpu": kvevents.TierDevice, "CPU": kvevents.TierHost,
		"CPU_PINNED": kvevents.TierHost, "cpu_pinned": kvevents.TierHost, "DISK": kvevents.TierDisk, "STORAGE": kvevents.TierExternal, "EXTERNAL": kvevents.TierExternal} {
		if got := mediumTier(m); got != want {
			t.Errorf("mediumTier(%q) = %v, want %v", m, got, want)
		}
	}
}

func FuzzDecodeVLLMBatch(f *testing.F) {
	vecs := loadVLLMVectors(f)
	for _, name := range vllmVectorFiles {
		f.Add(vecs[name])
	}
	f.Add(mp(f, []any{0.0, []any{storedEv(nil, []uint64{1, 2}, vecTokens)}, 0}))
	f.Add(mp(f, omap{{"events", []any{storedMap(kv{"extra_keys", []any{[]any{"s"}, nil}}), []any{"AllBlocksCleared"}}}, {"ts", 1.0}}))
	f.Add(mp(f, []any{0.0, []any{storedMap(kv{"extra_keys", []any{[]any{[]any{"img", 2}}, []any{[]any{"img", -2}}}})}, 0}))
	var vb Batch
	conv, _ := NewConverter(ConverterConfig{BlockSize: 4, MaxTracked: 1024})
	seqConv, _ := NewConverter(ConverterConfig{BlockSize: 4, MaxTracked: 1024, SeqKeyed: true})
	var out, seqOut []kvevents.Event
	f.Fuzz(func(t *testing.T, data []byte) {
		err := DecodeBatch(data, &vb)
		if err != nil {
			if !errors.Is(err, kvevents.ErrTruncated) && !errors.Is(err, kvevents.ErrMalformed) && !errors.Is(err, kvevents.ErrOversized) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		out, err = conv.Convert(&vb, out[:0])
		if err != nil && !errors.Is(err, ErrUnknownParent) && !errors.Is(err, ErrBlockSizeMismatch) && !errors.Is(err, ErrTokenCount) && !errors.Is(err, ErrBadMedia) {
			t.Fatalf("untyped convert error %v", err)
		}
		// Every stored event's blocks come from one vLLM event's hashes.
		for _, ev := range out {
			if ev.Kind == kvevents.KindStored && len(ev.Blocks) > len(vb.tokens) {
				t.Fatalf("stored event with %d blocks from %d tokens", len(ev.Blocks), len(vb.tokens))
			}
		}
		// The sequence-keyed converter fails alike and its events make a
		// valid sequence-keyed batch.
		var seqErr error
		seqOut, seqErr = seqConv.Convert(&vb, seqOut[:0])
		if (seqErr == nil) != (err == nil) {
			t.Fatalf("engine-keyed convert error %v, sequence-keyed %v", err, seqErr)
		}
		if len(seqOut) > 0 {
			if _, err := kvevents.AppendBatch(nil, &kvevents.Batch{Worker: "w", FirstEventID: 1, SeqKeyed: true, Events: seqOut}); err != nil {
				t.Fatalf("sequence-keyed events do not encode: %v", err)
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
			var vb Batch
			conv, _ := NewConverter(ConverterConfig{BlockSize: 16})
			var out []kvevents.Event
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if err := DecodeBatch(payload, &vb); err != nil {
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
	var vb Batch
	conv, _ := NewConverter(ConverterConfig{BlockSize: 16})
	var out []kvevents.Event
	run := func() {
		if err := DecodeBatch(payload, &vb); err != nil {
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
