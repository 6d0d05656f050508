package vllm

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

// A BlockStored's extra_keys with multimodal pairs, as vLLM orders them
// (LoRA name, pairs, salt on the first block), decode into Media per
// block; the LoRA name and salt are still read.
func TestDecodeMediaKeys(t *testing.T) {
	extra := []any{[]any{"ad", []any{"img", 3}, "salty"}, []any{"ad", []any{"img", -1}, []any{"img2", 0}}}
	data := mp(t, []any{0.0, []any{storedMap(kv{"lora_name", "ad"}, kv{"extra_keys", extra})}, 0})
	var vb Batch
	if err := DecodeBatch(data, &vb); err != nil {
		t.Fatal(err)
	}
	ev := vb.Events[0]
	want := []kvevents.MediaKey{{Block: 0, ID: "img", Offset: 3}, {Block: 1, ID: "img", Offset: -1}, {Block: 1, ID: "img2", Offset: 0}}
	if !slices.Equal(ev.Media, want) || ev.BadMedia || !ev.Multimodal || ev.LoraName != "ad" || ev.CacheSalt != "salty" {
		t.Fatalf("event %+v, want media %+v", ev, want)
	}
}

// A multimodal entry that is not [str, int] marks the event BadMedia; the
// batch still decodes, and the converter skips the event (never hashing
// its blocks without the keys) with ErrBadMedia.
func TestBadMediaKeysSkipTheEvent(t *testing.T) {
	for _, pair := range []any{[]any{"img"}, []any{1, 2}, []any{"img", "x"}, []any{"img", 1, 2}, []any{"img", int64(1) << 50}, []any{[]any{"img"}, 0}} {
		data := mp(t, []any{0.0, []any{storedMap(kv{"extra_keys", []any{[]any{pair}, nil}})}, 0})
		var vb Batch
		if err := DecodeBatch(data, &vb); err != nil {
			t.Fatalf("%v: %v", pair, err)
		}
		if !vb.Events[0].BadMedia {
			t.Fatalf("%v: not marked BadMedia", pair)
		}
		conv, _ := NewConverter(ConverterConfig{BlockSize: 4})
		out, err := conv.Convert(&vb, nil)
		if !errors.Is(err, ErrBadMedia) || len(out) != 0 || conv.Stats().BadMedia != 1 {
			t.Fatalf("%v: convert %v, %d events, stats %+v", pair, err, len(out), conv.Stats())
		}
	}
	// Pairs for more entries than blocks: which block they belong to is
	// unknown.
	data := mp(t, []any{0.0, []any{storedMap(kv{"extra_keys", []any{nil, nil, []any{[]any{"img", 0}}}})}, 0})
	var vb Batch
	if err := DecodeBatch(data, &vb); err != nil {
		t.Fatal(err)
	}
	conv, _ := NewConverter(ConverterConfig{BlockSize: 4})
	if _, err := conv.Convert(&vb, nil); !errors.Is(err, ErrBadMedia) {
		t.Fatalf("3 entries for 2 blocks: %v", err)
	}
}

// What an engine publishes for a prompt with images (the pairs of
// kvevents.AppendMediaKeys, encoded as vLLM does, in two events the
// second chained onto the first) converts to exactly the hashes the router
// computes from the items (kvevents.SeqHashesMedia), in both encodings.
func TestConvertMediaMatchesRouter(t *testing.T) {
	const bs, nb = 4, 6
	tokens := make([]uint32, nb*bs)
	for i := range tokens {
		tokens[i] = uint32(i % 5)
	}
	items := []kvevents.MediaItem{{ID: "cat", Offset: 3, Length: 6}, {ID: "dog", Offset: 9, Length: 2}, {ID: "cat", Offset: 16, Length: 4}}
	want := kvevents.SeqHashesMedia(nil, tokens, bs, kvevents.HashSeed, items)
	for _, enc := range []Encoding{MapEvents, ArrayEvents} {
		e := Encoder{Encoding: enc}
		hashes := []kvevents.EngineHash{11, 12, 13, 14, 15, 16}
		for _, run := range [][2]int{{0, 2}, {2, nb}} {
			ev := Event{Kind: kvevents.KindStored, BlockHashes: hashes[run[0]:run[1]], TokenIDs: tokens[run[0]*bs : run[1]*bs],
				BlockSize: bs, Medium: "GPU", HasExtraKeys: true, ExtraKeyCount: run[1] - run[0],
				Media: kvevents.AppendMediaKeys(nil, items, run[0]*bs, run[1]-run[0], bs)}
			if run[0] > 0 {
				ev.Parent, ev.HasParent = hashes[run[0]-1], true
			}
			if err := e.Add(&ev); err != nil {
				t.Fatal(err)
			}
		}
		var vb Batch
		if err := DecodeBatch(e.Finish(nil, 1, 0), &vb); err != nil {
			t.Fatal(err)
		}
		conv, _ := NewConverter(ConverterConfig{BlockSize: bs})
		out, err := conv.Convert(&vb, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []kvevents.SeqHash
		for _, ev := range out {
			for _, b := range ev.Blocks {
				got = append(got, b.Seq)
			}
		}
		if !slices.Equal(got, want) || conv.Stats().Multimodal != 2 {
			t.Fatalf("%v: got %x, want %x (stats %+v)", enc, got, want, conv.Stats())
		}
	}
}

// The encoder writes the pairs where vLLM does: after the LoRA name, before
// the first block's salt; blocks without keys are nil.
func TestEncodeMediaKeysOrder(t *testing.T) {
	ev := Event{Kind: kvevents.KindStored, BlockHashes: []kvevents.EngineHash{1, 2, 3}, TokenIDs: make([]uint32, 6), BlockSize: 2,
		LoraName: "ad", CacheSalt: "s", HasExtraKeys: true, ExtraKeyCount: 3,
		Media: []kvevents.MediaKey{{Block: 0, ID: "img", Offset: 1}, {Block: 1, ID: "img", Offset: -1}}}
	e := Encoder{Encoding: ArrayEvents}
	if err := e.Add(&ev); err != nil {
		t.Fatal(err)
	}
	got := e.Finish(nil, 0, 0)
	want := mp(t, []any{[]any{"ad", []any{"img", 1}, "s"}, []any{"ad", []any{"img", -1}}, []any{"ad"}})
	if !bytes.Contains(got, append(mp(t, "ad"), want...)) { // lora_name, then extra_keys
		t.Fatalf("encoded\n%x\nwant\n%x", got, want)
	}
}

// FuzzDecodeVLLMMediaKeys puts arbitrary bytes where one block's
// extra_keys entry goes: decoding never panics and fails only with the
// typed errors; what decodes as good pairs re-encodes and decodes to the
// same pairs; the converter hashes it or refuses it with a typed error.
func FuzzDecodeVLLMMediaKeys(f *testing.F) {
	full := mp(f, []any{0.0, []any{omap{{"type", "BlockStored"}, {"block_hashes", u64s(1)}, {"parent_block_hash", nil},
		{"token_ids", toks(1, 2, 3, 4)}, {"block_size", 4}, {"extra_keys", nil}}}, 0})
	prefix := full[:len(full)-2] // without the extra_keys value (nil) and the dp rank
	for _, entry := range []any{[]any{[]any{"img", 3}}, []any{"lora", []any{"img", -4}, []any{"b", 0}, "salt"}, []any{[]any{"img"}}, nil} {
		f.Add(mp(f, entry))
	}
	var vb, again Batch
	f.Fuzz(func(t *testing.T, entry []byte) {
		data := append(append(append(slices.Clip(prefix), 0x91), entry...), 0x00)
		if err := DecodeBatch(data, &vb); err != nil {
			if !errors.Is(err, kvevents.ErrTruncated) && !errors.Is(err, kvevents.ErrMalformed) && !errors.Is(err, kvevents.ErrOversized) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		ev := vb.Events[0]
		for _, k := range ev.Media {
			if k.Block != 0 {
				t.Fatalf("pair of block %d in a one-entry extra_keys", k.Block)
			}
		}
		conv, _ := NewConverter(ConverterConfig{BlockSize: 4})
		if _, err := conv.Convert(&vb, nil); err != nil && !errors.Is(err, ErrBadMedia) {
			t.Fatalf("convert: %v", err)
		}
		if ev.BadMedia {
			return
		}
		enc, err := AppendBatch(nil, &vb, MapEvents)
		if err != nil {
			if !errors.Is(err, kvevents.ErrMalformed) { // the bytes ran into the envelope: a bad dp rank
				t.Fatal(err)
			}
			return
		}
		if err := DecodeBatch(enc, &again); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if got := again.Events[0].Media; !reflect.DeepEqual(slices.Clip(got), slices.Clip(ev.Media)) && (len(got) != 0 || len(ev.Media) != 0) {
			t.Fatalf("pairs %+v re-decode as %+v", ev.Media, got)
		}
	})
}
