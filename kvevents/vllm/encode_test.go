package vllm

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

// vectorContent is the content every shared vector carries, built the way
// a simulated engine fills its events.
func vectorContent() []Event {
	return []Event{
		{
			Kind: kvevents.KindStored, BlockHashes: []kvevents.EngineHash{vecHash0, vecHash1}, TokenIDs: vecTokens, BlockSize: 4,
			Medium: "GPU", HasExtraKeys: true, ExtraKeyCount: 2, HasGroupIdx: true, SpecKind: "full_attention",
		},
		{Kind: kvevents.KindRemoved, BlockHashes: []kvevents.EngineHash{vecHash1}, Medium: "GPU", HasGroupIdx: true},
	}
}

// TestVLLMEncoderReproducesVectors: the vectors' content encodes to the
// vectors' exact bytes, and so does every vector decoded and re-encoded.
func TestVLLMEncoderReproducesVectors(t *testing.T) {
	for _, tc := range []struct {
		name string
		enc  Encoding
		file string
	}{
		{"A map events", MapEvents, "vllm_kvbatch_A_map_events.bin"},
		{"B positional events", ArrayEvents, "vllm_kvbatch_B_positional_events.bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := loadVLLMVectors(t)[tc.file]
			e := Encoder{Encoding: tc.enc}
			for _, ev := range vectorContent() {
				if err := e.Add(&ev); err != nil {
					t.Fatal(err)
				}
			}
			if got := e.Finish(nil, 1700000000.5, 0); !bytes.Equal(got, want) {
				t.Fatalf("built from content:\n got %x\nwant %x", got, want)
			}
			var vb Batch
			if err := DecodeBatch(want, &vb); err != nil {
				t.Fatal(err)
			}
			got, err := AppendBatch(nil, &vb, tc.enc)
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
	hs := make([]kvevents.EngineHash, 16)
	tokens := make([]any, 256)
	ts := make([]uint32, 256)
	for i := range hashes {
		hs[i] = kvevents.EngineHash(uint64(0x9e3779b97f4a7c15) * uint64(i+1))
		hashes[i] = uint64(hs[i])
	}
	for i := range tokens {
		ts[i] = uint32(i*7919) % 151000
		tokens[i] = int(ts[i])
	}
	extra := make([]any, 16)
	ev := Event{Kind: kvevents.KindStored, BlockHashes: hs, Parent: 0x1234, HasParent: true, TokenIDs: ts, BlockSize: 16,
		Medium: "GPU", HasExtraKeys: true, ExtraKeyCount: 16, HasGroupIdx: true, SpecKind: "full_attention"}
	for _, tc := range []struct {
		enc  Encoding
		want any
	}{
		{ArrayEvents, []any{"BlockStored", hashes, 0x1234, tokens, 16, nil, "GPU", nil, extra, 0, "full_attention", nil}},
		{MapEvents, omap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", 0x1234}, {"token_ids", tokens},
			{"block_size", 16}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}, {"extra_keys", extra},
			{"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"}}},
	} {
		t.Run(tc.enc.String(), func(t *testing.T) {
			want := mp(t, []any{1700000000.5, []any{tc.want}, 3})
			e := Encoder{Encoding: tc.enc}
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
	longHashes := make([]kvevents.EngineHash, 40)
	for i := range long {
		long[i] = uint32(i * 2654435761 % 151000)
	}
	for i := range longHashes {
		longHashes[i] = kvevents.EngineHash(uint64(i+1) * 0x9e3779b97f4a7c15)
	}
	events := []Event{
		{Kind: kvevents.KindStored, BlockHashes: []kvevents.EngineHash{1}, Parent: 1 << 63, HasParent: true, TokenIDs: []uint32{9, 8}, BlockSize: 2},
		{Kind: kvevents.KindStored, BlockHashes: longHashes, TokenIDs: long, BlockSize: 16, Medium: "GPU", LoraName: "adapter-a",
			CacheSalt: "salt", HasExtraKeys: true, ExtraKeyCount: 40, LoraID: -7, HasLoraID: true,
			GroupIdx: 3, HasGroupIdx: true, SpecKind: "sliding_window", SlidingWindow: 4096, HasSlidingWindow: true},
		{Kind: kvevents.KindStored, BlockHashes: []kvevents.EngineHash{0}, TokenIDs: []uint32{0}, BlockSize: 1, LoraID: 70000, HasLoraID: true, Medium: "CPU"},
		{Kind: kvevents.KindRemoved, BlockHashes: longHashes, Medium: "GPU", GroupIdx: -40000, HasGroupIdx: true},
		{Kind: kvevents.KindRemoved, BlockHashes: []kvevents.EngineHash{5}},
		{Kind: kvevents.KindCleared},
	}
	for _, enc := range []Encoding{MapEvents, ArrayEvents} {
		t.Run(enc.String(), func(t *testing.T) {
			e := Encoder{Encoding: enc}
			for i := range events {
				if err := e.Add(&events[i]); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
			payload := e.Finish(nil, 12.25, 7)
			var vb Batch
			if err := DecodeBatch(payload, &vb); err != nil {
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
			if payload = e.Finish(payload[:0], 0, -1); DecodeBatch(payload, &vb) != nil || vb.HasDPRank || len(vb.Events) != 0 {
				t.Fatalf("empty batch with nil rank: %x decodes to %+v", payload, vb)
			}
		})
	}
}

// normalized drops what the decoder derives or interns, for comparisons.
func normalized(ev Event) Event {
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
		ev   Event
		want string
	}{
		{"unknown kind", Event{Tag: "Weird"}, "kind"},
		{"stored without blocks", Event{Kind: kvevents.KindStored, BlockSize: 4}, "without blocks"},
		{"short token ids", Event{Kind: kvevents.KindStored, BlockHashes: []kvevents.EngineHash{1}, TokenIDs: []uint32{1}, BlockSize: 4}, "1 tokens for 1 blocks of 4"},
		{"zero block size", Event{Kind: kvevents.KindStored, BlockHashes: []kvevents.EngineHash{1}}, "blocks of 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e Encoder
			err := e.Add(&tc.ev)
			if !errors.Is(err, kvevents.ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want kvevents.ErrMalformed mentioning %q", err, tc.want)
			}
			if e.Len() != 0 {
				t.Fatalf("rejected event was added")
			}
		})
	}
	b := Batch{HasDPRank: true, DPRank: -1}
	if _, err := AppendBatch(nil, &b, MapEvents); !errors.Is(err, kvevents.ErrMalformed) {
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
	var vb, again Batch
	f.Fuzz(func(t *testing.T, data []byte) {
		if DecodeBatch(data, &vb) != nil {
			return
		}
		for _, enc := range []Encoding{MapEvents, ArrayEvents} {
			first, err := AppendBatch(nil, &vb, enc)
			if err != nil {
				if !errors.Is(err, kvevents.ErrMalformed) {
					t.Fatalf("untyped encode error %v", err)
				}
				continue
			}
			if err := DecodeBatch(first, &again); err != nil {
				t.Fatalf("%v: encoder output does not decode: %v\n%x", enc, err, first)
			}
			second, err := AppendBatch(nil, &again, enc)
			if err != nil || !bytes.Equal(first, second) {
				t.Fatalf("%v: not a fixed point (%v):\n%x\n%x", enc, err, first, second)
			}
		}
	})
}

// BenchmarkVLLMEncodeStored16x16 encodes one BlockStored of 16 blocks x 16
// tokens and finishes the batch, the per-step cost a publishing engine pays.
func BenchmarkVLLMEncodeStored16x16(b *testing.B) {
	var vb Batch
	if err := DecodeBatch(vllmStored16x16(b, true), &vb); err != nil {
		b.Fatal(err)
	}
	for _, enc := range []Encoding{ArrayEvents, MapEvents} {
		b.Run(enc.String(), func(b *testing.B) {
			e := Encoder{Encoding: enc}
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
