package vllm

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/kvrouter/kvrouter/internal/msgpack"
	"github.com/kvrouter/kvrouter/kvevents"
)

// This file encodes vLLM's KVEventBatch exactly as vLLM's msgspec encoder
// writes it (shared/reference/wire-formats.md, sections 3 to 5), so that
// a simulated engine publishes what a real one does. It is the inverse of
// DecodeBatch for every field an engine sets; both test vectors A and B
// are reproduced byte for byte.

// Encoding selects how events inside the batch envelope are written. The
// envelope itself is always the array [ts, events, data_parallel_rank].
type Encoding uint8

const (
	// MapEvents writes each event as a map whose first key is "type"
	// (the tag), fields in definition order, fields with a None default left
	// out when None: vLLM 0.24 and later (PR #42892), test vector A.
	MapEvents Encoding = iota
	// ArrayEvents writes each event as a positional array, tag first,
	// every field written (BlockStored 12 elements, BlockRemoved 4): vLLM
	// 0.11 to 0.23, test vector B.
	ArrayEvents
)

func (e Encoding) String() string {
	switch e {
	case MapEvents:
		return "map"
	case ArrayEvents:
		return "array"
	}
	return fmt.Sprintf("vllm.Encoding(%d)", uint8(e))
}

// Encoder builds one KVEventBatch payload event by event: Add encodes an
// event at once (so the caller may reuse its slices right after), Finish
// wraps what was added in the envelope. The zero value encodes map events.
// Reuse one encoder: its buffer is recycled, so a steady stream does not
// allocate beyond the payloads it returns. Not safe for concurrent use.
type Encoder struct {
	Encoding Encoding

	events []byte // encoded events since the last Finish
	n      int    // their count

	// BlockRemoved's bytes around its hash list, for the last (encoding,
	// medium, group) seen: an evicting engine writes one per block.
	rmKey          removedKey
	rmHead, rmTail []byte
}

type removedKey struct {
	valid    bool
	enc      Encoding
	medium   string
	hasGroup bool
	group    int64
}

// Len returns the number of events added since the last Finish.
func (e *Encoder) Len() int { return e.n }

// Reset drops the events added since the last Finish.
func (e *Encoder) Reset() { e.events, e.n = e.events[:0], 0 }

// Add encodes one event. Which fields are used depends on ev.Kind:
//
//   - kvevents.KindStored (BlockStored): BlockHashes, Parent/HasParent, TokenIDs,
//     BlockSize, LoraID/HasLoraID, Medium, LoraName, extra_keys (written
//     when HasExtraKeys: one entry per block, nil unless the block carries
//     the LoRA name, multimodal pairs (Media) or, on the first block,
//     CacheSalt, in vLLM's order),
//     GroupIdx/HasGroupIdx, SpecKind, SlidingWindow/HasSlidingWindow;
//   - kvevents.KindRemoved (BlockRemoved): BlockHashes, Medium, GroupIdx/HasGroupIdx;
//   - kvevents.KindCleared (AllBlocksCleared): nothing.
//
// Empty strings are written as None. Hashes are written as unsigned
// integers (vLLM's default int form). Errors wrap kvevents.ErrMalformed: an unknown
// kind, a BlockStored without blocks, or token_ids that are not exactly
// len(BlockHashes)·BlockSize; the event is then not added.
func (e *Encoder) Add(ev *Event) error {
	switch ev.Kind {
	case kvevents.KindStored:
		if len(ev.BlockHashes) == 0 {
			return fmt.Errorf("%w: vLLM BlockStored without blocks", kvevents.ErrMalformed)
		}
		if ev.BlockSize < 1 || len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
			return fmt.Errorf("%w: vLLM BlockStored with %d tokens for %d blocks of %d",
				kvevents.ErrMalformed, len(ev.TokenIDs), len(ev.BlockHashes), ev.BlockSize)
		}
		e.events = e.stored(e.events, ev)
	case kvevents.KindRemoved:
		e.events = e.removed(e.events, ev)
	case kvevents.KindCleared:
		if e.Encoding == ArrayEvents {
			e.events = msgpack.AppendStr(msgpack.AppendArrayHeader(e.events, 1), "AllBlocksCleared")
		} else {
			e.events = msgpack.AppendStr(msgpack.AppendStr(msgpack.AppendMapHeader(e.events, 1), "type"), "AllBlocksCleared")
		}
	default:
		return fmt.Errorf("%w: cannot encode vLLM event of kind %v", kvevents.ErrMalformed, ev.Kind)
	}
	e.n++
	return nil
}

// Finish appends to dst the batch [ts, events, data_parallel_rank] holding
// every event added since the last Finish (dp rank None when dpRank < 0),
// and starts a new batch.
func (e *Encoder) Finish(dst []byte, ts float64, dpRank int) []byte {
	dst = msgpack.AppendArrayHeader(dst, 3)
	dst = msgpack.AppendFloat64(dst, ts)
	dst = msgpack.AppendArrayHeader(dst, e.n)
	// One append of the whole body: when it must grow dst, the runtime
	// copies without zeroing first (a Grow beforehand would zero it all).
	dst = append(dst, e.events...)
	if dpRank < 0 {
		dst = msgpack.AppendNil(dst)
	} else {
		dst = msgpack.AppendUint(dst, uint64(dpRank))
	}
	e.Reset()
	return dst
}

// AppendBatch appends b encoded with enc to dst: the inverse of
// DecodeBatch for the fields Add documents.
func AppendBatch(dst []byte, b *Batch, enc Encoding) ([]byte, error) {
	e := Encoder{Encoding: enc}
	for i := range b.Events {
		if err := e.Add(&b.Events[i]); err != nil {
			return dst, fmt.Errorf("vLLM event %d: %w", i, err)
		}
	}
	rank := -1
	if b.HasDPRank {
		if b.DPRank < 0 || b.DPRank > math.MaxInt32 {
			return dst, fmt.Errorf("%w: data_parallel_rank %d", kvevents.ErrMalformed, b.DPRank)
		}
		rank = int(b.DPRank)
	}
	return e.Finish(dst, b.TS, rank), nil
}

// stored writes a BlockStored. Field order (vLLM's definition order):
// block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
// lora_name, then the None-default fields extra_keys, group_idx,
// kv_cache_spec_kind, kv_cache_spec_sliding_window.
func (e *Encoder) stored(dst []byte, ev *Event) []byte {
	array := e.Encoding == ArrayEvents
	if array {
		dst = msgpack.AppendArrayHeader(dst, 12)
		dst = msgpack.AppendStr(dst, "BlockStored")
	} else {
		n := 8 // type + the seven required fields
		for _, set := range [...]bool{ev.HasExtraKeys, ev.HasGroupIdx, ev.SpecKind != "", ev.HasSlidingWindow} {
			if set {
				n++
			}
		}
		dst = msgpack.AppendMapHeader(dst, n)
		dst = msgpack.AppendStr(msgpack.AppendStr(dst, "type"), "BlockStored")
	}
	key := func(name string) {
		if !array {
			dst = msgpack.AppendStr(dst, name)
		}
	}
	key("block_hashes")
	dst = appendHashes(dst, ev.BlockHashes)
	key("parent_block_hash")
	if ev.HasParent {
		dst = msgpack.AppendUint(dst, uint64(ev.Parent))
	} else {
		dst = msgpack.AppendNil(dst)
	}
	key("token_ids")
	dst = appendTokens(msgpack.AppendArrayHeader(dst, len(ev.TokenIDs)), ev.TokenIDs)
	key("block_size")
	dst = msgpack.AppendUint(dst, uint64(ev.BlockSize))
	key("lora_id")
	if ev.HasLoraID {
		dst = msgpack.AppendInt(dst, ev.LoraID)
	} else {
		dst = msgpack.AppendNil(dst)
	}
	key("medium")
	dst = appendOptStr(dst, ev.Medium)
	key("lora_name")
	dst = appendOptStr(dst, ev.LoraName)

	// The None-default fields: always present in the array form, left out
	// of the map form when None.
	if array || ev.HasExtraKeys {
		key("extra_keys")
		if ev.HasExtraKeys {
			dst = appendExtraKeys(dst, ev, len(ev.BlockHashes))
		} else {
			dst = msgpack.AppendNil(dst)
		}
	}
	if array || ev.HasGroupIdx {
		key("group_idx")
		dst = appendOptInt(dst, ev.GroupIdx, ev.HasGroupIdx)
	}
	if array || ev.SpecKind != "" {
		key("kv_cache_spec_kind")
		dst = appendOptStr(dst, ev.SpecKind)
	}
	if array || ev.HasSlidingWindow {
		key("kv_cache_spec_sliding_window")
		dst = appendOptInt(dst, ev.SlidingWindow, ev.HasSlidingWindow)
	}
	return dst
}

// removed writes a BlockRemoved: block_hashes, medium, group_idx. All but
// the hash list is the same from one event to the next, so those bytes are
// built once per (encoding, medium, group) and copied.
func (e *Encoder) removed(dst []byte, ev *Event) []byte {
	k := removedKey{valid: true, enc: e.Encoding, medium: ev.Medium, hasGroup: ev.HasGroupIdx, group: ev.GroupIdx}
	if k != e.rmKey {
		e.rmKey = k
		e.rmHead, e.rmTail = e.removedParts(e.rmHead[:0], e.rmTail[:0], ev)
	}
	dst = append(dst, e.rmHead...)
	dst = appendHashes(dst, ev.BlockHashes)
	return append(dst, e.rmTail...)
}

// removedParts builds a BlockRemoved's bytes before and after its hash list.
func (e *Encoder) removedParts(head, tail []byte, ev *Event) ([]byte, []byte) {
	if e.Encoding == ArrayEvents {
		head = msgpack.AppendStr(msgpack.AppendArrayHeader(head, 4), "BlockRemoved")
		tail = appendOptStr(tail, ev.Medium)
		return head, appendOptInt(tail, ev.GroupIdx, ev.HasGroupIdx)
	}
	n := 3
	if ev.HasGroupIdx {
		n++
	}
	head = msgpack.AppendStr(msgpack.AppendStr(msgpack.AppendMapHeader(head, n), "type"), "BlockRemoved")
	head = msgpack.AppendStr(head, "block_hashes")
	tail = appendOptStr(msgpack.AppendStr(tail, "medium"), ev.Medium)
	if ev.HasGroupIdx {
		tail = msgpack.AppendInt(msgpack.AppendStr(tail, "group_idx"), ev.GroupIdx)
	}
	return head, tail
}

// appendExtraKeys writes one extra_keys entry per block: nil, or the
// block's keys in vLLM's order (LoRA name, the block's multimodal
// [identifier, offset] pairs from ev.Media, then the cache salt on the
// first block only).
func appendExtraKeys(dst []byte, ev *Event, blocks int) []byte {
	dst = msgpack.AppendArrayHeader(dst, blocks)
	media := ev.Media
	for i := 0; i < blocks; i++ {
		for len(media) > 0 && media[0].Block < i {
			media = media[1:] // out of order: belongs to no block left
		}
		pairs := 0
		for pairs < len(media) && media[pairs].Block == i {
			pairs++
		}
		n := pairs
		if ev.LoraName != "" {
			n++
		}
		if i == 0 && ev.CacheSalt != "" {
			n++
		}
		if n == 0 {
			dst = msgpack.AppendNil(dst)
			continue
		}
		dst = msgpack.AppendArrayHeader(dst, n)
		if ev.LoraName != "" {
			dst = msgpack.AppendStr(dst, ev.LoraName)
		}
		dst = appendMediaPairs(dst, media[:pairs])
		media = media[pairs:]
		if i == 0 && ev.CacheSalt != "" {
			dst = msgpack.AppendStr(dst, ev.CacheSalt)
		}
	}
	return dst
}

// appendTokens writes token ids in msgpack's smallest unsigned forms, into
// room reserved once (at most 5 bytes a token) rather than token by token:
// token lists are most of an engine's event bytes.
func appendTokens(dst []byte, ts []uint32) []byte {
	n := len(dst)
	dst = slices.Grow(dst, 5*len(ts))[:n+5*len(ts)]
	for _, t := range ts {
		switch {
		case t <= 0x7f:
			dst[n] = byte(t)
			n++
		case t <= math.MaxUint8:
			dst[n], dst[n+1] = 0xcc, byte(t)
			n += 2
		case t <= math.MaxUint16:
			dst[n], dst[n+1], dst[n+2] = 0xcd, byte(t>>8), byte(t)
			n += 3
		default:
			dst[n] = 0xce
			binary.BigEndian.PutUint32(dst[n+1:], t)
			n += 5
		}
	}
	return dst[:n]
}

func appendHashes(dst []byte, hs []kvevents.EngineHash) []byte {
	dst = msgpack.AppendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = msgpack.AppendUint(dst, uint64(h))
	}
	return dst
}

func appendOptInt(dst []byte, v int64, ok bool) []byte {
	if !ok {
		return msgpack.AppendNil(dst)
	}
	return msgpack.AppendInt(dst, v)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return msgpack.AppendNil(dst)
	}
	return msgpack.AppendStr(dst, s)
}
