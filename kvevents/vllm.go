package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// This file decodes vLLM's KVEventBatch (the msgpack payload frame of its
// ZMQ event stream; SGLang and TensorRT-LLM publish the same shapes) and
// converts it into our Events. Shapes accepted, per
// ../shared/reference/wire-formats.md:
//
//   - envelope: array [ts, events, dp_rank] with 2 or more elements (extra
//     ones ignored), or a map {"ts", "events", "data_parallel_rank"} in any
//     key order;
//   - events: positional arrays with the tag first (BlockStored of 5 to 12+
//     elements, BlockRemoved of 2 to 4+, AllBlocksCleared of 1+), or maps
//     with a "type" key, keys in any order, unknown keys skipped;
//   - hashes: uint64, negative int64 (two's complement), or bytes (last 8
//     bytes big-endian, as vLLM's own int conversion).

// Limits on one vLLM payload, enforced before allocating.
const (
	MaxVLLMBatchBytes = 16 << 20
	maxVLLMBlockSize  = 1 << 20
)

// VLLMEvent is one decoded vLLM event. Only the fields of its Kind are set.
type VLLMEvent struct {
	// Kind is KindStored (BlockStored), KindRemoved (BlockRemoved),
	// KindCleared (AllBlocksCleared), or 0 for a tag this decoder does not
	// know (Tag then holds it); the converter skips unknown events.
	Kind EventKind
	Tag  string

	BlockHashes []EngineHash // stored or removed blocks, in order
	Parent      EngineHash   // BlockStored: parent_block_hash
	HasParent   bool         // false when parent_block_hash is nil (sequence start)
	TokenIDs    []uint32     // BlockStored: all tokens of the blocks
	BlockSize   int          // BlockStored: tokens per block

	LoraID    int64 // deprecated lora_id, kept for completeness
	HasLoraID bool
	Medium    string // as sent; "" when nil or absent
	Tier      Tier   // Medium mapped: nil/GPU device, CPU/CPU_PINNED host, DISK disk, else external
	LoraName  string // "" when nil or absent
	CacheSalt string // from extra_keys (first block), metadata.cache_salt or cache_salt

	HasExtraKeys  bool // extra_keys present and not nil
	ExtraKeyCount int  // number of per-block extra_keys entries
	Multimodal    bool // extra_keys carried multimodal identifiers (not hashed; see doc)

	GroupIdx         int64
	HasGroupIdx      bool
	SpecKind         string // kv_cache_spec_kind; "" when nil or absent
	SlidingWindow    int64
	HasSlidingWindow bool
	Remote           bool // locality == "REMOTE"
}

// VLLMBatch is one decoded KVEventBatch. Reuse one value across
// DecodeVLLMBatch calls: its event, hash and token buffers are recycled, so
// a steady stream decodes without allocating. The slices in Events alias
// those buffers and are valid until the next decode into the same value.
type VLLMBatch struct {
	TS        float64
	DPRank    int64
	HasDPRank bool
	Events    []VLLMEvent

	tokens []uint32
	hashes []EngineHash
	strs   map[string]string // interned LoRA names, salts, media, tags
}

// DecodeVLLMBatch decodes one vLLM KVEventBatch payload into into, reusing
// its buffers. Errors wrap ErrTruncated, ErrMalformed or ErrOversized; on
// error into holds no events.
func DecodeVLLMBatch(data []byte, into *VLLMBatch) error {
	into.TS, into.DPRank, into.HasDPRank = 0, 0, false
	events := into.Events[:0]
	into.Events = nil
	if len(data) > MaxVLLMBatchBytes {
		return fmt.Errorf("%w: vLLM batch of %d bytes, limit %d", ErrOversized, len(data), MaxVLLMBatchBytes)
	}
	d := vllmDecoder{r: mpReader{b: data}, b: into, tokens: into.tokens[:0], hashes: into.hashes[:0], events: events}
	err := d.batch()
	into.tokens, into.hashes = d.tokens, d.hashes
	if err != nil {
		into.Events = d.events[:0]
		return err
	}
	if d.r.remaining() != 0 {
		into.Events = d.events[:0]
		return fmt.Errorf("%w: %d trailing bytes after the vLLM batch", ErrMalformed, d.r.remaining())
	}
	into.Events = d.events
	return nil
}

type vllmDecoder struct {
	r      mpReader
	b      *VLLMBatch
	events []VLLMEvent
	tokens []uint32
	hashes []EngineHash
}

func (d *vllmDecoder) batch() error {
	c, err := d.r.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		return d.batchMap()
	}
	n, err := d.r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("%w: vLLM batch array of %d elements, want at least 2", ErrMalformed, n)
	}
	if err := d.ts(); err != nil {
		return err
	}
	if err := d.eventList(); err != nil {
		return err
	}
	if n >= 3 {
		if err := d.dpRank(); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err := d.r.skip(); err != nil {
			return err
		}
	}
	return nil
}

func (d *vllmDecoder) batchMap() error {
	n, err := d.r.mapLen()
	if err != nil {
		return err
	}
	sawEvents := false
	for i := 0; i < n; i++ {
		key, err := d.r.str()
		if err != nil {
			return err
		}
		switch string(key) {
		case "ts":
			err = d.ts()
		case "events":
			if sawEvents {
				return fmt.Errorf("%w: vLLM batch map has two \"events\" keys", ErrMalformed)
			}
			sawEvents = true
			err = d.eventList()
		case "data_parallel_rank", "attn_dp_rank":
			err = d.dpRank()
		default:
			err = d.r.skip()
		}
		if err != nil {
			return err
		}
	}
	if !sawEvents {
		return fmt.Errorf("%w: vLLM batch map without \"events\"", ErrMalformed)
	}
	return nil
}

func (d *vllmDecoder) ts() error {
	if d.r.nextIsNil() {
		return nil
	}
	v, err := d.r.float()
	d.b.TS = v
	return err
}

func (d *vllmDecoder) dpRank() error {
	if d.r.nextIsNil() {
		return nil
	}
	v, err := d.r.int64()
	if err != nil {
		return err
	}
	d.b.DPRank, d.b.HasDPRank = v, true
	return nil
}

func (d *vllmDecoder) eventList() error {
	n, err := d.r.arrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		d.events = append(d.events, VLLMEvent{})
		ev := &d.events[len(d.events)-1]
		if err := d.event(ev); err != nil {
			return fmt.Errorf("vLLM event %d: %w", i, err)
		}
	}
	return nil
}

func isMap(c byte) bool { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }

// Field numbers shared by the positional and the map form.
const (
	fTag = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoraID
	fMedium
	fLoraName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fLocality
	fMetadata
	fCacheSalt
	fUnknown
)

// Positional field order of BlockStored and BlockRemoved (index = position).
var (
	storedFields  = [...]int{fTag, fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoraID, fMedium, fLoraName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow}
	removedFields = [...]int{fTag, fBlockHashes, fMedium, fGroupIdx}
)

func mapField(key []byte) int {
	switch string(key) {
	case "type":
		return fTag
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoraID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoraName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	case "locality":
		return fLocality
	case "metadata":
		return fMetadata
	case "cache_salt":
		return fCacheSalt
	}
	return fUnknown
}

// have records which required fields an event carried.
type have uint8

const (
	haveHashes have = 1 << iota
	haveTokens
	haveBlockSize
)

func (d *vllmDecoder) event(ev *VLLMEvent) error {
	c, err := d.r.peek()
	if err != nil {
		return err
	}
	var got have
	tokStart, hashStart := len(d.tokens), len(d.hashes)
	var extraStrs extraKeyStrings
	if isMap(c) {
		n, err := d.r.mapLen()
		if err != nil {
			return err
		}
		sawTag := false
		for i := 0; i < n; i++ {
			key, err := d.r.str()
			if err != nil {
				return err
			}
			f := mapField(key)
			if f == fTag {
				sawTag = true
			}
			if err := d.field(ev, f, &got, &extraStrs); err != nil {
				return fmt.Errorf("field %q: %w", key, err)
			}
		}
		if !sawTag {
			return fmt.Errorf("%w: event map without \"type\"", ErrMalformed)
		}
	} else {
		n, err := d.r.arrayLen()
		if err != nil {
			return err
		}
		if n < 1 {
			return fmt.Errorf("%w: empty event array", ErrMalformed)
		}
		if err := d.field(ev, fTag, &got, &extraStrs); err != nil {
			return err
		}
		var order []int
		switch ev.Kind {
		case KindStored:
			order = storedFields[:]
			if n < fBlockSize+1 {
				return fmt.Errorf("%w: BlockStored array of %d elements, want at least %d", ErrMalformed, n, fBlockSize+1)
			}
		case KindRemoved:
			order = removedFields[:]
			if n < 2 {
				return fmt.Errorf("%w: BlockRemoved array of %d elements, want at least 2", ErrMalformed, n)
			}
		}
		for i := 1; i < n; i++ {
			f := fUnknown
			if i < len(order) {
				f = order[i]
			}
			if err := d.field(ev, f, &got, &extraStrs); err != nil {
				return fmt.Errorf("position %d: %w", i, err)
			}
		}
	}
	switch ev.Kind {
	case KindStored:
		if got&(haveHashes|haveTokens|haveBlockSize) != haveHashes|haveTokens|haveBlockSize {
			return fmt.Errorf("%w: BlockStored without block_hashes, token_ids or block_size", ErrMalformed)
		}
	case KindRemoved:
		if got&haveHashes == 0 {
			return fmt.Errorf("%w: BlockRemoved without block_hashes", ErrMalformed)
		}
	}
	ev.Tier = mediumTier(ev.Medium)
	if ev.CacheSalt == "" {
		ev.CacheSalt = d.intern(extraStrs.salt(ev.LoraName))
	}
	// Subslice the shared buffers only now: they may have grown meanwhile.
	if got&haveHashes != 0 {
		ev.BlockHashes = d.hashes[hashStart:len(d.hashes):len(d.hashes)]
	}
	if got&haveTokens != 0 {
		ev.TokenIDs = d.tokens[tokStart:len(d.tokens):len(d.tokens)]
	}
	return nil
}

func (d *vllmDecoder) field(ev *VLLMEvent, f int, got *have, extra *extraKeyStrings) error {
	r := &d.r
	var err error
	switch f {
	case fTag:
		var tag []byte
		if tag, err = r.str(); err != nil {
			return err
		}
		switch string(tag) {
		case "BlockStored":
			ev.Kind = KindStored
		case "BlockRemoved":
			ev.Kind = KindRemoved
		case "AllBlocksCleared":
			ev.Kind = KindCleared
		default:
			ev.Kind, ev.Tag = 0, d.intern(tag)
		}
	case fBlockHashes:
		if *got&haveHashes != 0 {
			return fmt.Errorf("%w: block_hashes twice", ErrMalformed)
		}
		*got |= haveHashes
		err = d.hashList()
	case fParent:
		if r.nextIsNil() {
			ev.HasParent = false
			return nil
		}
		var h EngineHash
		if h, err = r.hash(); err == nil {
			ev.Parent, ev.HasParent = h, true
		}
	case fTokenIDs:
		if *got&haveTokens != 0 {
			return fmt.Errorf("%w: token_ids twice", ErrMalformed)
		}
		*got |= haveTokens
		err = d.tokenList()
	case fBlockSize:
		var v uint64
		if v, err = r.uint(); err != nil {
			return err
		}
		if v < 1 || v > maxVLLMBlockSize {
			return fmt.Errorf("%w: block_size %d", ErrMalformed, v)
		}
		ev.BlockSize = int(v)
		*got |= haveBlockSize
	case fLoraID:
		if !r.nextIsNil() {
			ev.LoraID, err = r.int64()
			ev.HasLoraID = err == nil
		}
	case fMedium:
		ev.Medium, err = d.optString()
	case fLoraName:
		ev.LoraName, err = d.optString()
	case fExtraKeys:
		err = d.extraKeys(ev, extra)
	case fGroupIdx:
		if !r.nextIsNil() {
			ev.GroupIdx, err = r.int64()
			ev.HasGroupIdx = err == nil
		}
	case fSpecKind:
		ev.SpecKind, err = d.optString()
	case fSlidingWindow:
		if !r.nextIsNil() {
			ev.SlidingWindow, err = r.int64()
			ev.HasSlidingWindow = err == nil
		}
	case fLocality:
		var s []byte
		if !r.nextIsNil() {
			if s, err = r.str(); err == nil {
				ev.Remote = bytes.EqualFold(s, []byte("REMOTE"))
			}
		}
	case fMetadata:
		err = d.metadata(ev)
	case fCacheSalt:
		if !r.nextIsNil() {
			var s []byte
			if s, err = r.str(); err == nil {
				ev.CacheSalt = d.intern(s)
			}
		}
	default:
		err = r.skip()
	}
	return err
}

// optString reads a string or nil, interned.
func (d *vllmDecoder) optString() (string, error) {
	if d.r.nextIsNil() {
		return "", nil
	}
	s, err := d.r.str()
	if err != nil {
		return "", err
	}
	return d.intern(s), nil
}

func (d *vllmDecoder) hashList() error {
	n, err := d.r.arrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		h, err := d.r.hash()
		if err != nil {
			return err
		}
		d.hashes = append(d.hashes, h)
	}
	return nil
}

// tokenList reads token ids with an inline fast path for the unsigned
// forms msgspec writes; anything else goes through the general reader.
func (d *vllmDecoder) tokenList() error {
	r := &d.r
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	base := len(d.tokens)
	toks := slices.Grow(d.tokens, n)[:base+n]
	out := toks[base:]
	b, off := r.b, r.off
	for i := range out {
		if off < len(b) {
			switch c := b[off]; {
			case c <= 0x7f:
				out[i] = uint32(c)
				off++
				continue
			case c == 0xcc && off+2 <= len(b):
				out[i] = uint32(b[off+1])
				off += 2
				continue
			case c == 0xcd && off+3 <= len(b):
				out[i] = uint32(b[off+1])<<8 | uint32(b[off+2])
				off += 3
				continue
			case c == 0xce && off+5 <= len(b):
				out[i] = binary.BigEndian.Uint32(b[off+1:])
				off += 5
				continue
			}
		}
		r.off = off
		t, err := r.uint32v()
		if err != nil {
			d.tokens = toks[:base+i]
			return err
		}
		out[i] = t
		off = r.off
	}
	r.off = off
	d.tokens = toks
	return nil
}

// extraKeyStrings collects the bare strings of the first block's extra_keys
// entry: the LoRA name and the cache salt, in vLLM's order.
type extraKeyStrings struct {
	n    int
	strs [4][]byte
}

// salt returns the last first-block string that is not the LoRA name.
func (e *extraKeyStrings) salt(lora string) []byte {
	for i := e.n - 1; i >= 0; i-- {
		if string(e.strs[i]) != lora {
			return e.strs[i]
		}
	}
	return nil
}

// extraKeys reads extra_keys: nil, or one entry per block, each nil or an
// array of items (strings: LoRA name and cache salt; [mm_id, offset] pairs;
// bytes: prompt-embeds digests).
func (d *vllmDecoder) extraKeys(ev *VLLMEvent, out *extraKeyStrings) error {
	r := &d.r
	if r.nextIsNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	ev.HasExtraKeys, ev.ExtraKeyCount = true, n
	for i := 0; i < n; i++ {
		if r.nextIsNil() {
			continue
		}
		c, err := r.peek()
		if err != nil {
			return err
		}
		if isMap(c) || !(c >= 0x90 && c <= 0x9f || c == 0xdc || c == 0xdd) {
			// Not a tuple: tolerate and ignore.
			if err := r.skip(); err != nil {
				return err
			}
			continue
		}
		m, err := r.arrayLen()
		if err != nil {
			return err
		}
		for j := 0; j < m; j++ {
			c, err := r.peek()
			if err != nil {
				return err
			}
			switch {
			case c >= 0xa0 && c <= 0xbf || c == 0xd9 || c == 0xda || c == 0xdb:
				s, err := r.str()
				if err != nil {
					return err
				}
				if i == 0 && out.n < len(out.strs) {
					out.strs[out.n] = s
					out.n++
				}
			case c >= 0x90 && c <= 0x9f || c == 0xdc || c == 0xdd:
				ev.Multimodal = true
				if err := r.skip(); err != nil {
					return err
				}
			default:
				if err := r.skip(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// metadata reads SGLang's {"cache_salt": str} map.
func (d *vllmDecoder) metadata(ev *VLLMEvent) error {
	r := &d.r
	if r.nextIsNil() {
		return nil
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	if !isMap(c) {
		return r.skip()
	}
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		key, err := r.str()
		if err != nil {
			return err
		}
		if string(key) == "cache_salt" && !r.nextIsNil() {
			if c, _ := r.peek(); c >= 0xa0 && c <= 0xbf || c == 0xd9 || c == 0xda || c == 0xdb {
				s, err := r.str()
				if err != nil {
					return err
				}
				ev.CacheSalt = d.intern(s)
				continue
			}
		}
		if err := r.skip(); err != nil {
			return err
		}
	}
	return nil
}

// maxVLLMInterned bounds the intern table; it is reset when full.
const maxVLLMInterned = 1024

// intern returns s as a string, allocating only the first time a value is
// seen (and never for the well-known media and spec kinds).
func (d *vllmDecoder) intern(s []byte) string {
	if len(s) == 0 {
		return ""
	}
	switch string(s) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "CPU_PINNED":
		return "CPU_PINNED"
	case "DISK":
		return "DISK"
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	case "mamba":
		return "mamba"
	}
	m := d.b.strs
	if m == nil {
		m = make(map[string]string)
		d.b.strs = m
	}
	if v, ok := m[string(s)]; ok {
		return v
	}
	if len(m) >= maxVLLMInterned {
		clear(m)
	}
	v := string(s)
	m[v] = v
	return v
}

// mediumTier maps vLLM/SGLang medium names to tiers (case-insensitive).
func mediumTier(m string) Tier {
	switch {
	case m == "" || m == "GPU" || equalFoldASCII(m, "GPU"):
		return TierDevice
	case m == "CPU" || equalFoldASCII(m, "CPU") || equalFoldASCII(m, "CPU_PINNED"):
		return TierHost
	case equalFoldASCII(m, "DISK"):
		return TierDisk
	}
	return TierExternal
}

func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// hash reads a block hash in any of its wire forms: an unsigned integer, a
// negative signed integer (reinterpreted as its two's complement), or bytes
// (the last 8 bytes big-endian; fewer than 8 bytes are read as a shorter
// big-endian number, like Python's int.from_bytes(h, "big") & (2**64-1)).
func (r *mpReader) hash() (EngineHash, error) {
	if r.off+9 <= len(r.b) && r.b[r.off] == 0xcf {
		v := binary.BigEndian.Uint64(r.b[r.off+1:])
		r.off += 9
		return EngineHash(v), nil
	}
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c == 0xc4 || c == 0xc5 || c == 0xc6 {
		p, err := r.bin()
		if err != nil {
			return 0, err
		}
		if len(p) > 8 {
			p = p[len(p)-8:]
		}
		var v uint64
		for _, x := range p {
			v = v<<8 | uint64(x)
		}
		return EngineHash(v), nil
	}
	v, _, err := r.integer()
	return EngineHash(v), err
}

// int64 reads a signed integer; an unsigned value above MaxInt64 is an error.
func (r *mpReader) int64() (int64, error) {
	start := r.off
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, fmt.Errorf("%w: integer %d at byte %d exceeds int64", ErrMalformed, v, start)
	}
	return int64(v), nil
}

// Conversion errors, wrapped with the event's position by Convert.
var (
	// ErrUnknownParent: a BlockStored's parent_block_hash is not a block
	// this converter has seen stored (and not yet removed), so its sequence
	// hashes cannot be computed. The event is skipped, never guessed.
	ErrUnknownParent = errors.New("kvevents: unknown parent block")
	// ErrBlockSizeMismatch: a BlockStored's block_size differs from the
	// converter's configured block size. The event is skipped.
	ErrBlockSizeMismatch = errors.New("kvevents: block size mismatch")
	// ErrTokenCount: token_ids does not hold exactly len(block_hashes) *
	// block_size tokens. The event is skipped.
	ErrTokenCount = errors.New("kvevents: token count does not match blocks")
)

// ConverterConfig configures a Converter.
type ConverterConfig struct {
	// BlockSize is the engine's KV block size in tokens (vLLM default 16).
	// Required.
	BlockSize int
	// MaxTracked bounds the engine-hash table (default 1<<21 entries, a few
	// times any real engine's cache). If it is exceeded the table is reset
	// and counted, and later children of forgotten blocks are reported as
	// unknown parents.
	MaxTracked int
	// AllGroups keeps events of every KV cache group. By default events whose
	// kv_cache_spec_kind is set and is not "full_attention" (sliding-window
	// and mamba groups of hybrid models) are skipped: their blocks cannot be
	// prefix-matched.
	AllGroups bool
}

// ConverterStats counts what a Converter did. Skipped events are counted by
// reason; every skip also makes Convert return an error for its batch.
type ConverterStats struct {
	Events         uint64 // events returned
	StoredBlocks   uint64
	RemovedBlocks  uint64
	Clears         uint64
	UnknownParent  uint64 // BlockStored events skipped: parent not known
	BlockSizeError uint64 // BlockStored events skipped: block_size mismatch
	TokenCount     uint64 // BlockStored events skipped: token count mismatch
	SkippedGroup   uint64 // events of non-full-attention groups skipped
	SkippedRemote  uint64 // events with locality REMOTE skipped
	UnknownTag     uint64 // events with an unknown tag skipped
	Multimodal     uint64 // BlockStored events whose multimodal extra keys were ignored
	TableResets    uint64 // times the engine-hash table hit MaxTracked
}

// Converter turns decoded vLLM batches of ONE engine (one worker and DP
// rank: engine hashes are only meaningful per engine) into Events. It hashes
// token_ids into sequence hashes and remembers engine hash -> sequence hash
// for every stored block, so a later BlockStored whose parent is a known
// block continues that block's chain (and its LoRA/salt seed). Not safe for
// concurrent use.
type Converter struct {
	cfg    ConverterConfig
	known  map[EngineHash]convEntry
	blocks []StoredBlock
	seqs   []SeqHash
	stats  ConverterStats
}

// convEntry is what the converter knows about one engine block.
type convEntry struct {
	seq   SeqHash
	seed  uint64 // the local-hash seed of its chain, inherited by children
	tiers uint8  // bit per Tier that holds a copy; the entry goes when none do
}

// NewConverter returns a converter for an engine with cfg.BlockSize.
func NewConverter(cfg ConverterConfig) (*Converter, error) {
	if cfg.BlockSize < 1 || cfg.BlockSize > maxVLLMBlockSize {
		return nil, fmt.Errorf("kvevents: converter block size %d out of range", cfg.BlockSize)
	}
	if cfg.MaxTracked <= 0 {
		cfg.MaxTracked = 1 << 21
	}
	return &Converter{cfg: cfg, known: make(map[EngineHash]convEntry)}, nil
}

// Stats returns the converter's counters.
func (c *Converter) Stats() ConverterStats { return c.stats }

// Tracked returns how many engine blocks the converter currently knows.
func (c *Converter) Tracked() int { return len(c.known) }

// Convert appends to dst one Event per usable event of vb, in order, and
// returns it. Stored events carry the engine hash (for later parents and
// removals) and the sequence hash of every block; Removed events carry
// engine hashes; AllBlocksCleared becomes KindCleared and forgets every
// block. Events that cannot be converted are skipped and counted; the
// returned error then describes the first of them (wrapping
// ErrUnknownParent, ErrBlockSizeMismatch or ErrTokenCount), while the
// returned events are still valid and should be published. The Blocks and
// Removed slices alias the converter's and vb's buffers: they are valid
// until the next Convert or the next decode into vb.
func (c *Converter) Convert(vb *VLLMBatch, dst []Event) ([]Event, error) {
	var first error
	fail := func(i int, err error) {
		if first == nil {
			first = fmt.Errorf("vLLM event %d: %w", i, err)
		}
	}
	blocks := c.blocks[:0]
	for i := range vb.Events {
		ev := &vb.Events[i]
		switch {
		case ev.Kind == 0:
			c.stats.UnknownTag++
			continue
		case ev.Remote:
			c.stats.SkippedRemote++
			continue
		case !c.cfg.AllGroups && ev.SpecKind != "" && ev.SpecKind != "full_attention":
			c.stats.SkippedGroup++
			continue
		}
		switch ev.Kind {
		case KindCleared:
			clear(c.known)
			c.stats.Clears++
			dst = append(dst, Event{Kind: KindCleared, Tier: ev.Tier})
		case KindRemoved:
			bit := tierBit(ev.Tier)
			for _, h := range ev.BlockHashes {
				if e, ok := c.known[h]; ok {
					if e.tiers &^= bit; e.tiers == 0 {
						delete(c.known, h)
					} else {
						c.known[h] = e
					}
				}
			}
			c.stats.RemovedBlocks += uint64(len(ev.BlockHashes))
			dst = append(dst, Event{Kind: KindRemoved, Tier: ev.Tier, Removed: ev.BlockHashes})
		case KindStored:
			var err error
			var out Event
			if out, blocks, err = c.stored(ev, blocks); err != nil {
				fail(i, err)
				continue
			}
			dst = append(dst, out)
		default:
			continue
		}
		c.stats.Events++
	}
	c.blocks = blocks
	return dst, first
}

func tierBit(t Tier) uint8 {
	if t > 7 {
		t = 7
	}
	return 1 << t
}

func (c *Converter) stored(ev *VLLMEvent, blocks []StoredBlock) (Event, []StoredBlock, error) {
	bs := c.cfg.BlockSize
	if ev.BlockSize != bs {
		c.stats.BlockSizeError++
		return Event{}, blocks, fmt.Errorf("%w: event block_size %d, configured %d", ErrBlockSizeMismatch, ev.BlockSize, bs)
	}
	if len(ev.TokenIDs) != len(ev.BlockHashes)*bs {
		c.stats.TokenCount++
		return Event{}, blocks, fmt.Errorf("%w: %d tokens for %d blocks of %d", ErrTokenCount, len(ev.TokenIDs), len(ev.BlockHashes), bs)
	}
	var seed uint64
	if ev.HasParent {
		p, ok := c.known[ev.Parent]
		if !ok {
			c.stats.UnknownParent++
			return Event{}, blocks, fmt.Errorf("%w: parent %#016x", ErrUnknownParent, uint64(ev.Parent))
		}
		seed = p.seed
		if ev.CacheSalt != "" {
			seed = SeedFor(ev.LoraName, ev.CacheSalt)
		}
		c.seqs = SeqHashesFrom(c.seqs[:0], p.seq, ev.TokenIDs, bs, seed)
	} else {
		seed = SeedFor(ev.LoraName, ev.CacheSalt)
		c.seqs = SeqHashes(c.seqs[:0], ev.TokenIDs, bs, seed)
	}
	if ev.Multimodal {
		c.stats.Multimodal++
	}
	if len(c.known)+len(ev.BlockHashes) > c.cfg.MaxTracked {
		clear(c.known)
		c.stats.TableResets++
	}
	bit := tierBit(ev.Tier)
	start := len(blocks)
	for j, h := range ev.BlockHashes {
		s := c.seqs[j]
		e := c.known[h]
		if e.seq != s {
			e = convEntry{seq: s, seed: seed}
		}
		e.tiers |= bit
		c.known[h] = e
		blocks = append(blocks, StoredBlock{Engine: h, Seq: s})
	}
	c.stats.StoredBlocks += uint64(len(ev.BlockHashes))
	return Event{
		Kind: KindStored, Tier: ev.Tier, Parent: ev.Parent, HasParent: ev.HasParent,
		Blocks: blocks[start:len(blocks):len(blocks)],
	}, blocks, nil
}
