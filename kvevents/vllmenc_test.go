package kvevents

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// vectorContent is the content every shared vector carries, built the way
// a simulated engine fills its events.
func vectorContent() []VLLMEvent {
	return []VLLMEvent{
		{
			Kind: KindStored, BlockHashes: []EngineHash{vecHash0, vecHash1}, TokenIDs: vecTokens, BlockSize: 4,
			Medium: "GPU", HasExtraKeys: true, ExtraKeyCount: 2, HasGroupIdx: true, SpecKind: "full_attention",
		},
		{Kind: KindRemoved, BlockHashes: []EngineHash{vecHash1}, Medium: "GPU", HasGroupIdx: true},
	}
}

// TestVLLMEncoderReproducesVectors: the vectors' content encodes to the
// vectors' exact bytes, and so does every vector decoded and re-encoded.
func TestVLLMEncoderReproducesVectors(t *testing.T) {
	for _, tc := range []struct {
		name string
		enc  VLLMEncoding
		file string
	}{
		{"A map events", VLLMMapEvents, "vllm_kvbatch_A_map_events.bin"},
		{"B positional events", VLLMArrayEvents, "vllm_kvbatch_B_positional_events.bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := loadVLLMVectors(t)[tc.file]
			e := VLLMEncoder{Encoding: tc.enc}
			for _, ev := range vectorContent() {
				if err := e.Add(&ev); err != nil {
					t.Fatal(err)
				}
			}
			if got := e.Finish(nil, 1700000000.5, 0); !bytes.Equal(got, want) {
				t.Fatalf("built from content:\n got %x\nwant %x", got, want)
			}
			var vb VLLMBatch
			if err := DecodeVLLMBatch(want, &vb); err != nil {
				t.Fatal(err)
			}
			got, err := AppendVLLMBatch(nil, &vb, tc.enc)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("decoded and re-encoded:\n got %x\nwant %x", got, want)
			}
		})
	}
}

// TestVLLMEncoderMatchesMsgpackLibrary compares a 16-block event (16-bit
// array headers, every integer width) with the same event built through
// vmihailenco/msgpack, an encoder written independently of ours (Go ints,
// which it writes in the smallest form as msgspec does).
func TestVLLMEncoderMatchesMsgpackLibrary(t *testing.T) {
	hashes := make([]any, 16)
	hs := make([]EngineHash, 16)
	tokens := make([]any, 256)
	ts := make([]uint32, 256)
	for i := range hashes {
		hs[i] = EngineHash(uint64(0x9e3779b97f4a7c15) * uint64(i+1))
		hashes[i] = uint64(hs[i])
	}
	for i := range tokens {
		ts[i] = uint32(i*7919) % 151000
		tokens[i] = int(ts[i])
	}
	extra := make([]any, 16)
	ev := VLLMEvent{Kind: KindStored, BlockHashes: hs, Parent: 0x1234, HasParent: true, TokenIDs: ts, BlockSize: 16,
		Medium: "GPU", HasExtraKeys: true, ExtraKeyCount: 16, HasGroupIdx: true, SpecKind: "full_attention"}
	for _, tc := range []struct {
		enc  VLLMEncoding
		want any
	}{
		{VLLMArrayEvents, []any{"BlockStored", hashes, 0x1234, tokens, 16, nil, "GPU", nil, extra, 0, "full_attention", nil}},
		{VLLMMapEvents, omap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", 0x1234}, {"token_ids", tokens},
			{"block_size", 16}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}, {"extra_keys", extra},
			{"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"}}},
	} {
		t.Run(tc.enc.String(), func(t *testing.T) {
			want := mp(t, []any{1700000000.5, []any{tc.want}, 3})
			e := VLLMEncoder{Encoding: tc.enc}
			if err := e.Add(&ev); err != nil {
				t.Fatal(err)
			}
			if got := e.Finish(nil, 1700000000.5, 3); !bytes.Equal(got, want) {
				t.Fatalf("\n got %x\nwant %x", got, want)
			}
		})
	}
}

// TestVLLMEncoderRoundTrip: every field the encoder writes comes back from
// the project's decoder, in both encodings.
func TestVLLMEncoderRoundTrip(t *testing.T) {
	long := make([]uint32, 40*16)
	longHashes := make([]EngineHash, 40)
	for i := range long {
		long[i] = uint32(i * 2654435761 % 151000)
	}
	for i := range longHashes {
		longHashes[i] = EngineHash(uint64(i+1) * 0x9e3779b97f4a7c15)
	}
	events := []VLLMEvent{
		{Kind: KindStored, BlockHashes: []EngineHash{1}, Parent: 1 << 63, HasParent: true, TokenIDs: []uint32{9, 8}, BlockSize: 2},
		{Kind: KindStored, BlockHashes: longHashes, TokenIDs: long, BlockSize: 16, Medium: "GPU", LoraName: "adapter-a",
			CacheSalt: "salt", HasExtraKeys: true, ExtraKeyCount: 40, LoraID: -7, HasLoraID: true,
			GroupIdx: 3, HasGroupIdx: true, SpecKind: "sliding_window", SlidingWindow: 4096, HasSlidingWindow: true},
		{Kind: KindStored, BlockHashes: []EngineHash{0}, TokenIDs: []uint32{0}, BlockSize: 1, LoraID: 70000, HasLoraID: true, Medium: "CPU"},
		{Kind: KindRemoved, BlockHashes: longHashes, Medium: "GPU", GroupIdx: -40000, HasGroupIdx: true},
		{Kind: KindRemoved, BlockHashes: []EngineHash{5}},
		{Kind: KindCleared},
	}
	for _, enc := range []VLLMEncoding{VLLMMapEvents, VLLMArrayEvents} {
		t.Run(enc.String(), func(t *testing.T) {
			e := VLLMEncoder{Encoding: enc}
			for i := range events {
				if err := e.Add(&events[i]); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
			payload := e.Finish(nil, 12.25, 7)
			var vb VLLMBatch
			if err := DecodeVLLMBatch(payload, &vb); err != nil {
				t.Fatal(err)
			}
			if vb.TS != 12.25 || !vb.HasDPRank || vb.DPRank != 7 || len(vb.Events) != len(events) {
				t.Fatalf("envelope ts %v rank %v/%d events %d", vb.TS, vb.HasDPRank, vb.DPRank, len(vb.Events))
			}
			for i := range events {
				want := events[i]
				want.Tier = mediumTier(want.Medium)
				if got := normalized(vb.Events[i]); !reflect.DeepEqual(got, normalized(want)) {
					t.Errorf("event %d:\n got %+v\nwant %+v", i, got, normalized(want))
				}
			}
			if payload = e.Finish(payload[:0], 0, -1); DecodeVLLMBatch(payload, &vb) != nil || vb.HasDPRank || len(vb.Events) != 0 {
				t.Fatalf("empty batch with nil rank: %x decodes to %+v", payload, vb)
			}
		})
	}
}

// normalized drops what the decoder derives or interns, for comparisons.
func normalized(ev VLLMEvent) VLLMEvent {
	if len(ev.BlockHashes) == 0 {
		ev.BlockHashes = nil
	}
	if len(ev.TokenIDs) == 0 {
		ev.TokenIDs = nil
	}
	return ev
}

func TestVLLMEncoderRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		ev   VLLMEvent
		want string
	}{
		{"unknown kind", VLLMEvent{Tag: "Weird"}, "kind"},
		{"stored without blocks", VLLMEvent{Kind: KindStored, BlockSize: 4}, "without blocks"},
		{"short token ids", VLLMEvent{Kind: KindStored, BlockHashes: []EngineHash{1}, TokenIDs: []uint32{1}, BlockSize: 4}, "1 tokens for 1 blocks of 4"},
		{"zero block size", VLLMEvent{Kind: KindStored, BlockHashes: []EngineHash{1}}, "blocks of 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e VLLMEncoder
			err := e.Add(&tc.ev)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrMalformed mentioning %q", err, tc.want)
			}
			if e.Len() != 0 {
				t.Fatalf("rejected event was added")
			}
		})
	}
	b := VLLMBatch{HasDPRank: true, DPRank: -1}
	if _, err := AppendVLLMBatch(nil, &b, VLLMMapEvents); !errors.Is(err, ErrMalformed) {
		t.Fatalf("negative dp rank: %v", err)
	}
}

// FuzzVLLMEncodeRoundTrip: whatever the decoder accepts and the encoder can
// write re-encodes to the same bytes after one round (encode is a fixed point
// of decode∘encode), in both encodings.
func FuzzVLLMEncodeRoundTrip(f *testing.F) {
	for _, v := range loadVLLMVectors(f) {
		f.Add(v)
	}
	f.Add(vllmStored16x16(f, true))
	var vb, again VLLMBatch
	f.Fuzz(func(t *testing.T, data []byte) {
		if DecodeVLLMBatch(data, &vb) != nil {
			return
		}
		for _, enc := range []VLLMEncoding{VLLMMapEvents, VLLMArrayEvents} {
			first, err := AppendVLLMBatch(nil, &vb, enc)
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("untyped encode error %v", err)
				}
				continue
			}
			if err := DecodeVLLMBatch(first, &again); err != nil {
				t.Fatalf("%v: encoder output does not decode: %v\n%x", enc, err, first)
			}
			second, err := AppendVLLMBatch(nil, &again, enc)
			if err != nil || !bytes.Equal(first, second) {
				t.Fatalf("%v: not a fixed point (%v):\n%x\n%x", enc, err, first, second)
			}
		}
	})
}

// BenchmarkVLLMEncodeStored16x16 encodes one BlockStored of 16 blocks x 16
// tokens and finishes the batch, the per-step cost a publishing engine pays.
func BenchmarkVLLMEncodeStored16x16(b *testing.B) {
	var vb VLLMBatch
	if err := DecodeVLLMBatch(vllmStored16x16(b, true), &vb); err != nil {
		b.Fatal(err)
	}
	for _, enc := range []VLLMEncoding{VLLMArrayEvents, VLLMMapEvents} {
		b.Run(enc.String(), func(b *testing.B) {
			e := VLLMEncoder{Encoding: enc}
			var buf []byte
			b.ReportAllocs()
			for b.Loop() {
				if err := e.Add(&vb.Events[0]); err != nil {
					b.Fatal(err)
				}
				buf = e.Finish(buf[:0], 1700000000.5, 0)
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}
