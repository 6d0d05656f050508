package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// This file encodes vLLM's KVEventBatch exactly as vLLM's msgspec encoder
// writes it (../shared/reference/wire-formats.md, sections 3 to 5), so that
// a simulated engine publishes what a real one does. It is the inverse of
// DecodeVLLMBatch for every field an engine sets; both test vectors A and B
// are reproduced byte for byte.

// VLLMEncoding selects how events inside the batch envelope are written. The
// envelope itself is always the array [ts, events, data_parallel_rank].
type VLLMEncoding uint8

const (
	// VLLMMapEvents writes each event as a map whose first key is "type"
	// (the tag), fields in definition order, fields with a None default left
	// out when None: vLLM 0.24 and later (PR #42892), test vector A.
	VLLMMapEvents VLLMEncoding = iota
	// VLLMArrayEvents writes each event as a positional array, tag first,
	// every field written (BlockStored 12 elements, BlockRemoved 4): vLLM
	// 0.11 to 0.23, test vector B.
	VLLMArrayEvents
)

func (e VLLMEncoding) String() string {
	switch e {
	case VLLMMapEvents:
		return "map"
	case VLLMArrayEvents:
		return "array"
	}
	return fmt.Sprintf("VLLMEncoding(%d)", uint8(e))
}

// VLLMEncoder builds one KVEventBatch payload event by event: Add encodes an
// event at once (so the caller may reuse its slices right after), Finish
// wraps what was added in the envelope. The zero value encodes map events.
// Reuse one encoder: its buffer is recycled, so a steady stream does not
// allocate beyond the payloads it returns. Not safe for concurrent use.
type VLLMEncoder struct {
	Encoding VLLMEncoding

	events []byte // encoded events since the last Finish
	n      int    // their count

	// BlockRemoved's bytes around its hash list, for the last (encoding,
	// medium, group) seen: an evicting engine writes one per block.
	rmKey          removedKey
	rmHead, rmTail []byte
}

type removedKey struct {
	valid    bool
	enc      VLLMEncoding
	medium   string
	hasGroup bool
	group    int64
}

// Len returns the number of events added since the last Finish.
func (e *VLLMEncoder) Len() int { return e.n }

// Reset drops the events added since the last Finish.
func (e *VLLMEncoder) Reset() { e.events, e.n = e.events[:0], 0 }

// Add encodes one event. Which fields are used depends on ev.Kind:
//
//   - KindStored (BlockStored): BlockHashes, Parent/HasParent, TokenIDs,
//     BlockSize, LoraID/HasLoraID, Medium, LoraName, extra_keys (written
//     when HasExtraKeys: one entry per block, nil unless the block carries
//     the LoRA name and, on the first block, CacheSalt, as vLLM orders them),
//     GroupIdx/HasGroupIdx, SpecKind, SlidingWindow/HasSlidingWindow;
//   - KindRemoved (BlockRemoved): BlockHashes, Medium, GroupIdx/HasGroupIdx;
//   - KindCleared (AllBlocksCleared): nothing.
//
// Empty strings are written as None. Hashes are written as unsigned
// integers (vLLM's default int form). Errors wrap ErrMalformed: an unknown
// kind, a BlockStored without blocks, or token_ids that are not exactly
// len(BlockHashes)·BlockSize; the event is then not added.
func (e *VLLMEncoder) Add(ev *VLLMEvent) error {
	switch ev.Kind {
	case KindStored:
		if len(ev.BlockHashes) == 0 {
			return fmt.Errorf("%w: vLLM BlockStored without blocks", ErrMalformed)
		}
		if ev.BlockSize < 1 || len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
			return fmt.Errorf("%w: vLLM BlockStored with %d tokens for %d blocks of %d",
				ErrMalformed, len(ev.TokenIDs), len(ev.BlockHashes), ev.BlockSize)
		}
		e.events = e.stored(e.events, ev)
	case KindRemoved:
		e.events = e.removed(e.events, ev)
	case KindCleared:
		if e.Encoding == VLLMArrayEvents {
			e.events = appendStr(appendArrayHeader(e.events, 1), "AllBlocksCleared")
		} else {
			e.events = appendStr(appendStr(appendMapHeader(e.events, 1), "type"), "AllBlocksCleared")
		}
	default:
		return fmt.Errorf("%w: cannot encode vLLM event of kind %v", ErrMalformed, ev.Kind)
	}
	e.n++
	return nil
}

// Finish appends to dst the batch [ts, events, data_parallel_rank] holding
// every event added since the last Finish (dp rank None when dpRank < 0),
// and starts a new batch.
func (e *VLLMEncoder) Finish(dst []byte, ts float64, dpRank int) []byte {
	dst = appendArrayHeader(dst, 3)
	dst = appendFloat64(dst, ts)
	dst = appendArrayHeader(dst, e.n)
	// One append of the whole body: when it must grow dst, the runtime
	// copies without zeroing first (a Grow beforehand would zero it all).
	dst = append(dst, e.events...)
	if dpRank < 0 {
		dst = appendNil(dst)
	} else {
		dst = appendUint(dst, uint64(dpRank))
	}
	e.Reset()
	return dst
}

// AppendVLLMBatch appends b encoded with enc to dst: the inverse of
// DecodeVLLMBatch for the fields Add documents.
func AppendVLLMBatch(dst []byte, b *VLLMBatch, enc VLLMEncoding) ([]byte, error) {
	e := VLLMEncoder{Encoding: enc}
	for i := range b.Events {
		if err := e.Add(&b.Events[i]); err != nil {
			return dst, fmt.Errorf("vLLM event %d: %w", i, err)
		}
	}
	rank := -1
	if b.HasDPRank {
		if b.DPRank < 0 || b.DPRank > math.MaxInt32 {
			return dst, fmt.Errorf("%w: data_parallel_rank %d", ErrMalformed, b.DPRank)
		}
		rank = int(b.DPRank)
	}
	return e.Finish(dst, b.TS, rank), nil
}

// stored writes a BlockStored. Field order (vLLM's definition order):
// block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
// lora_name, then the None-default fields extra_keys, group_idx,
// kv_cache_spec_kind, kv_cache_spec_sliding_window.
func (e *VLLMEncoder) stored(dst []byte, ev *VLLMEvent) []byte {
	array := e.Encoding == VLLMArrayEvents
	if array {
		dst = appendArrayHeader(dst, 12)
		dst = appendStr(dst, "BlockStored")
	} else {
		n := 8 // type + the seven required fields
		for _, set := range [...]bool{ev.HasExtraKeys, ev.HasGroupIdx, ev.SpecKind != "", ev.HasSlidingWindow} {
			if set {
				n++
			}
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(appendStr(dst, "type"), "BlockStored")
	}
	key := func(name string) {
		if !array {
			dst = appendStr(dst, name)
		}
	}
	key("block_hashes")
	dst = appendHashes(dst, ev.BlockHashes)
	key("parent_block_hash")
	if ev.HasParent {
		dst = appendUint(dst, uint64(ev.Parent))
	} else {
		dst = appendNil(dst)
	}
	key("token_ids")
	dst = appendTokens(appendArrayHeader(dst, len(ev.TokenIDs)), ev.TokenIDs)
	key("block_size")
	dst = appendUint(dst, uint64(ev.BlockSize))
	key("lora_id")
	if ev.HasLoraID {
		dst = appendInt(dst, ev.LoraID)
	} else {
		dst = appendNil(dst)
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
			dst = appendNil(dst)
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
func (e *VLLMEncoder) removed(dst []byte, ev *VLLMEvent) []byte {
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
func (e *VLLMEncoder) removedParts(head, tail []byte, ev *VLLMEvent) ([]byte, []byte) {
	if e.Encoding == VLLMArrayEvents {
		head = appendStr(appendArrayHeader(head, 4), "BlockRemoved")
		tail = appendOptStr(tail, ev.Medium)
		return head, appendOptInt(tail, ev.GroupIdx, ev.HasGroupIdx)
	}
	n := 3
	if ev.HasGroupIdx {
		n++
	}
	head = appendStr(appendStr(appendMapHeader(head, n), "type"), "BlockRemoved")
	head = appendStr(head, "block_hashes")
	tail = appendOptStr(appendStr(tail, "medium"), ev.Medium)
	if ev.HasGroupIdx {
		tail = appendInt(appendStr(tail, "group_idx"), ev.GroupIdx)
	}
	return head, tail
}

// appendExtraKeys writes one extra_keys entry per block: nil, or the
// block's string keys in vLLM's order (LoRA name, then the cache salt on
// the first block only).
func appendExtraKeys(dst []byte, ev *VLLMEvent, blocks int) []byte {
	dst = appendArrayHeader(dst, blocks)
	for i := 0; i < blocks; i++ {
		n := 0
		if ev.LoraName != "" {
			n++
		}
		if i == 0 && ev.CacheSalt != "" {
			n++
		}
		if n == 0 {
			dst = appendNil(dst)
			continue
		}
		dst = appendArrayHeader(dst, n)
		if ev.LoraName != "" {
			dst = appendStr(dst, ev.LoraName)
		}
		if i == 0 && ev.CacheSalt != "" {
			dst = appendStr(dst, ev.CacheSalt)
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

func appendHashes(dst []byte, hs []EngineHash) []byte {
	dst = appendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = appendUint(dst, uint64(h))
	}
	return dst
}

func appendMapHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xde, byte(n>>8), byte(n))
	default:
		return append(dst, 0xdf, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
}

// appendInt writes v in msgpack's smallest form: unsigned forms for v >= 0
// (as msgspec does), negative fixint or d0-d3 below zero.
func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return append(dst, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return append(dst, 0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
	}
}

func appendOptInt(dst []byte, v int64, ok bool) []byte {
	if !ok {
		return appendNil(dst)
	}
	return appendInt(dst, v)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return appendNil(dst)
	}
	return appendStr(dst, s)
}

// appendFloat64 writes v as float64 (cb): msgspec never shortens floats.
func appendFloat64(dst []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(v))
}
