package vllm

import (
	"bytes"
	"fmt"

	"github.com/kvrouter/kvrouter/internal/msgpack"
	"github.com/kvrouter/kvrouter/kvevents"
)

// This file decodes vLLM's KVEventBatch (the msgpack payload frame of its
// ZMQ event stream; SGLang and TensorRT-LLM publish the same shapes) into
// Events; convert.go turns those into kvevents.Events. Shapes accepted, per
// shared/reference/wire-formats.md:
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
	MaxBatchBytes = 16 << 20
	maxBlockSize  = 1 << 20
)

// Event is one decoded vLLM event. Only the fields of its Kind are set.
type Event struct {
	// Kind is kvevents.KindStored (BlockStored), KindRemoved
	// (BlockRemoved), KindCleared (AllBlocksCleared), or 0 for a tag this
	// decoder does not know (Tag then holds it); the converter skips
	// unknown events.
	Kind kvevents.EventKind
	Tag  string

	BlockHashes []kvevents.EngineHash // stored or removed blocks, in order
	Parent      kvevents.EngineHash   // BlockStored: parent_block_hash
	HasParent   bool                  // false when parent_block_hash is nil (sequence start)
	TokenIDs    []uint32              // BlockStored: all tokens of the blocks
	BlockSize   int                   // BlockStored: tokens per block

	LoraID    int64 // deprecated lora_id, kept for completeness
	HasLoraID bool
	Medium    string        // as sent; "" when nil or absent
	Tier      kvevents.Tier // Medium mapped: nil/GPU device, CPU/CPU_PINNED host, DISK disk, else external
	LoraName  string        // "" when nil or absent
	CacheSalt string        // from extra_keys (first block), metadata.cache_salt or cache_salt

	HasExtraKeys  bool // extra_keys present and not nil
	ExtraKeyCount int  // number of per-block extra_keys entries
	Multimodal    bool // extra_keys carried multimodal (identifier, offset) pairs
	// Media holds those pairs, Block being the entry's index in
	// extra_keys, in order (media.go). BadMedia: a multimodal entry was
	// not an (identifier, offset) pair, so the blocks' hashes cannot be
	// known; the converter skips the event.
	Media    []kvevents.MediaKey
	BadMedia bool

	GroupIdx         int64
	HasGroupIdx      bool
	SpecKind         string // kv_cache_spec_kind; "" when nil or absent
	SlidingWindow    int64
	HasSlidingWindow bool
	Remote           bool // locality == "REMOTE"
}

// Batch is one decoded KVEventBatch. Reuse one value across
// DecodeBatch calls: its event, hash and token buffers are recycled, so
// a steady stream decodes without allocating. The slices in Events alias
// those buffers and are valid until the next decode into the same value.
type Batch struct {
	TS        float64
	DPRank    int64
	HasDPRank bool
	Events    []Event

	tokens []uint32
	hashes []kvevents.EngineHash
	media  []kvevents.MediaKey
	strs   map[string]string // interned LoRA names, salts, media, tags
}

// DecodeBatch decodes one vLLM KVEventBatch payload into into, reusing its
// buffers. Errors wrap kvevents.ErrTruncated, ErrMalformed or ErrOversized;
// on error into holds no events.
func DecodeBatch(data []byte, into *Batch) error {
	into.TS, into.DPRank, into.HasDPRank = 0, 0, false
	events := into.Events[:0]
	into.Events = nil
	if len(data) > MaxBatchBytes {
		return fmt.Errorf("%w: vLLM batch of %d bytes, limit %d", kvevents.ErrOversized, len(data), MaxBatchBytes)
	}
	d := decoder{r: msgpack.NewReader(data), b: into, tokens: into.tokens[:0], hashes: into.hashes[:0], media: into.media[:0], events: events}
	err := d.batch()
	into.tokens, into.hashes, into.media = d.tokens, d.hashes, d.media
	if err != nil {
		into.Events = d.events[:0]
		return err
	}
	if d.r.Remaining() != 0 {
		into.Events = d.events[:0]
		return fmt.Errorf("%w: %d trailing bytes after the vLLM batch", kvevents.ErrMalformed, d.r.Remaining())
	}
	into.Events = d.events
	return nil
}

type decoder struct {
	r      msgpack.Reader
	b      *Batch
	events []Event
	tokens []uint32
	hashes []kvevents.EngineHash
	media  []kvevents.MediaKey
}

func (d *decoder) batch() error {
	c, err := d.r.Peek()
	if err != nil {
		return err
	}
	if msgpack.IsMap(c) {
		return d.batchMap()
	}
	n, err := d.r.ArrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("%w: vLLM batch array of %d elements, want at least 2", kvevents.ErrMalformed, n)
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
		if err := d.r.Skip(); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) batchMap() error {
	n, err := d.r.MapLen()
	if err != nil {
		return err
	}
	sawEvents := false
	for i := 0; i < n; i++ {
		key, err := d.r.Str()
		if err != nil {
			return err
		}
		switch string(key) {
		case "ts":
			err = d.ts()
		case "events":
			if sawEvents {
				return fmt.Errorf("%w: vLLM batch map has two \"events\" keys", kvevents.ErrMalformed)
			}
			sawEvents = true
			err = d.eventList()
		case "data_parallel_rank", "attn_dp_rank":
			err = d.dpRank()
		default:
			err = d.r.Skip()
		}
		if err != nil {
			return err
		}
	}
	if !sawEvents {
		return fmt.Errorf("%w: vLLM batch map without \"events\"", kvevents.ErrMalformed)
	}
	return nil
}

func (d *decoder) ts() error {
	if d.r.NextIsNil() {
		return nil
	}
	v, err := d.r.Float()
	d.b.TS = v
	return err
}

func (d *decoder) dpRank() error {
	if d.r.NextIsNil() {
		return nil
	}
	v, err := d.r.Int64()
	if err != nil {
		return err
	}
	d.b.DPRank, d.b.HasDPRank = v, true
	return nil
}

func (d *decoder) eventList() error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		d.events = append(d.events, Event{})
		ev := &d.events[len(d.events)-1]
		if err := d.event(ev); err != nil {
			return fmt.Errorf("vLLM event %d: %w", i, err)
		}
	}
	return nil
}

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

// event decodes one event, a map or a positional array, then checks that
// it carries what its kind requires and points its slices at the shared
// buffers.
func (d *decoder) event(ev *Event) error {
	c, err := d.r.Peek()
	if err != nil {
		return err
	}
	var got have
	tokStart, hashStart, mediaStart := len(d.tokens), len(d.hashes), len(d.media)
	var extraStrs extraKeyStrings
	if msgpack.IsMap(c) {
		err = d.eventMap(ev, &got, &extraStrs)
	} else {
		err = d.eventArray(ev, &got, &extraStrs)
	}
	if err != nil {
		return err
	}
	switch ev.Kind {
	case kvevents.KindStored:
		if got&(haveHashes|haveTokens|haveBlockSize) != haveHashes|haveTokens|haveBlockSize {
			return fmt.Errorf("%w: BlockStored without block_hashes, token_ids or block_size", kvevents.ErrMalformed)
		}
	case kvevents.KindRemoved:
		if got&haveHashes == 0 {
			return fmt.Errorf("%w: BlockRemoved without block_hashes", kvevents.ErrMalformed)
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
	if len(d.media) > mediaStart {
		ev.Media = d.media[mediaStart:len(d.media):len(d.media)]
	}
	return nil
}

// eventMap reads an event map: keys in any order, "type" required.
func (d *decoder) eventMap(ev *Event, got *have, extra *extraKeyStrings) error {
	n, err := d.r.MapLen()
	if err != nil {
		return err
	}
	sawTag := false
	for i := 0; i < n; i++ {
		key, err := d.r.Str()
		if err != nil {
			return err
		}
		f := mapField(key)
		if f == fTag {
			sawTag = true
		}
		if err := d.field(ev, f, got, extra); err != nil {
			return fmt.Errorf("field %q: %w", key, err)
		}
	}
	if !sawTag {
		return fmt.Errorf("%w: event map without \"type\"", kvevents.ErrMalformed)
	}
	return nil
}

// eventArray reads a positional event: the tag first, which names the
// field order of the rest; positions past the known fields are skipped.
func (d *decoder) eventArray(ev *Event, got *have, extra *extraKeyStrings) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("%w: empty event array", kvevents.ErrMalformed)
	}
	if err := d.field(ev, fTag, got, extra); err != nil {
		return err
	}
	var order []int
	switch ev.Kind {
	case kvevents.KindStored:
		order = storedFields[:]
		if n < fBlockSize+1 {
			return fmt.Errorf("%w: BlockStored array of %d elements, want at least %d", kvevents.ErrMalformed, n, fBlockSize+1)
		}
	case kvevents.KindRemoved:
		order = removedFields[:]
		if n < 2 {
			return fmt.Errorf("%w: BlockRemoved array of %d elements, want at least 2", kvevents.ErrMalformed, n)
		}
	}
	for i := 1; i < n; i++ {
		f := fUnknown
		if i < len(order) {
			f = order[i]
		}
		if err := d.field(ev, f, got, extra); err != nil {
			return fmt.Errorf("position %d: %w", i, err)
		}
	}
	return nil
}

// field reads the value of field f into ev: the tag, the block content
// (blockField) or an attribute (attrField). got records the required
// fields seen; extra collects the first block's extra_keys strings.
func (d *decoder) field(ev *Event, f int, got *have, extra *extraKeyStrings) error {
	switch f {
	case fTag:
		return d.tag(ev)
	case fBlockHashes, fParent, fTokenIDs, fBlockSize:
		return d.blockField(ev, f, got)
	}
	return d.attrField(ev, f, extra)
}

// tag reads the event's type; an unknown one is kept in Tag with Kind 0.
func (d *decoder) tag(ev *Event) error {
	tag, err := d.r.Str()
	if err != nil {
		return err
	}
	switch string(tag) {
	case "BlockStored":
		ev.Kind = kvevents.KindStored
	case "BlockRemoved":
		ev.Kind = kvevents.KindRemoved
	case "AllBlocksCleared":
		ev.Kind = kvevents.KindCleared
	default:
		ev.Kind, ev.Tag = 0, d.intern(tag)
	}
	return nil
}

// blockField reads what the blocks are: their hashes, their parent, their
// tokens and the block size. Hashes and tokens may appear once.
func (d *decoder) blockField(ev *Event, f int, got *have) error {
	r := &d.r
	switch f {
	case fBlockHashes:
		if *got&haveHashes != 0 {
			return fmt.Errorf("%w: block_hashes twice", kvevents.ErrMalformed)
		}
		*got |= haveHashes
		return d.hashList()
	case fParent:
		if r.NextIsNil() {
			ev.HasParent = false
			return nil
		}
		h, err := readHash(r)
		if err == nil {
			ev.Parent, ev.HasParent = h, true
		}
		return err
	case fTokenIDs:
		if *got&haveTokens != 0 {
			return fmt.Errorf("%w: token_ids twice", kvevents.ErrMalformed)
		}
		*got |= haveTokens
		var err error
		d.tokens, err = r.AppendUint32Array(d.tokens)
		return err
	default: // fBlockSize
		v, err := r.Uint()
		if err != nil {
			return err
		}
		if v < 1 || v > maxBlockSize {
			return fmt.Errorf("%w: block_size %d", kvevents.ErrMalformed, v)
		}
		ev.BlockSize = int(v)
		*got |= haveBlockSize
		return nil
	}
}

// attrField reads an optional attribute of the event (nil means absent),
// or skips a field this decoder does not know.
func (d *decoder) attrField(ev *Event, f int, extra *extraKeyStrings) error {
	r := &d.r
	var err error
	switch f {
	case fLoraID:
		err = d.optInt64(&ev.LoraID, &ev.HasLoraID)
	case fMedium:
		ev.Medium, err = d.optString()
	case fLoraName:
		ev.LoraName, err = d.optString()
	case fExtraKeys:
		err = d.extraKeys(ev, extra)
	case fGroupIdx:
		err = d.optInt64(&ev.GroupIdx, &ev.HasGroupIdx)
	case fSpecKind:
		ev.SpecKind, err = d.optString()
	case fSlidingWindow:
		err = d.optInt64(&ev.SlidingWindow, &ev.HasSlidingWindow)
	case fLocality:
		if !r.NextIsNil() {
			var s []byte
			if s, err = r.Str(); err == nil {
				ev.Remote = bytes.EqualFold(s, []byte("REMOTE"))
			}
		}
	case fMetadata:
		err = d.metadata(ev)
	case fCacheSalt:
		if !r.NextIsNil() {
			var s []byte
			if s, err = r.Str(); err == nil {
				ev.CacheSalt = d.intern(s)
			}
		}
	default:
		err = r.Skip()
	}
	return err
}

// optInt64 reads a signed integer or nil into *v, setting *has when it is
// an integer.
func (d *decoder) optInt64(v *int64, has *bool) error {
	if d.r.NextIsNil() {
		return nil
	}
	var err error
	*v, err = d.r.Int64()
	*has = err == nil
	return err
}

// optString reads a string or nil, interned.
func (d *decoder) optString() (string, error) {
	if d.r.NextIsNil() {
		return "", nil
	}
	s, err := d.r.Str()
	if err != nil {
		return "", err
	}
	return d.intern(s), nil
}

func (d *decoder) hashList() error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		h, err := readHash(&d.r)
		if err != nil {
			return err
		}
		d.hashes = append(d.hashes, h)
	}
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
func (d *decoder) extraKeys(ev *Event, out *extraKeyStrings) error {
	r := &d.r
	if r.NextIsNil() {
		return nil
	}
	n, err := r.ArrayLen()
	if err != nil {
		return err
	}
	ev.HasExtraKeys, ev.ExtraKeyCount = true, n
	for i := 0; i < n; i++ {
		if r.NextIsNil() {
			continue
		}
		c, err := r.Peek()
		if err != nil {
			return err
		}
		if !msgpack.IsArray(c) {
			// Not a tuple: tolerate and ignore.
			if err := r.Skip(); err != nil {
				return err
			}
			continue
		}
		m, err := r.ArrayLen()
		if err != nil {
			return err
		}
		for j := 0; j < m; j++ {
			c, err := r.Peek()
			if err != nil {
				return err
			}
			switch {
			case msgpack.IsStr(c):
				s, err := r.Str()
				if err != nil {
					return err
				}
				if i == 0 && out.n < len(out.strs) {
					out.strs[out.n] = s
					out.n++
				}
			case msgpack.IsArray(c):
				ev.Multimodal = true
				if err := d.mediaPair(ev, i); err != nil {
					return err
				}
			default:
				if err := r.Skip(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// metadata reads SGLang's {"cache_salt": str} map.
func (d *decoder) metadata(ev *Event) error {
	r := &d.r
	if r.NextIsNil() {
		return nil
	}
	c, err := r.Peek()
	if err != nil {
		return err
	}
	if !msgpack.IsMap(c) {
		return r.Skip()
	}
	n, err := r.MapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		key, err := r.Str()
		if err != nil {
			return err
		}
		if string(key) == "cache_salt" && !r.NextIsNil() {
			if c, _ := r.Peek(); msgpack.IsStr(c) {
				s, err := r.Str()
				if err != nil {
					return err
				}
				ev.CacheSalt = d.intern(s)
				continue
			}
		}
		if err := r.Skip(); err != nil {
			return err
		}
	}
	return nil
}

// maxInterned bounds the intern table; it is reset when full.
const maxInterned = 1024

// intern returns s as a string, allocating only the first time a value is
// seen (and never for the well-known media and spec kinds).
func (d *decoder) intern(s []byte) string {
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
	if len(m) >= maxInterned {
		clear(m)
	}
	v := string(s)
	m[v] = v
	return v
}

// mediumTier maps vLLM/SGLang medium names to tiers (case-insensitive).
func mediumTier(m string) kvevents.Tier {
	switch {
	case m == "" || m == "GPU" || equalFoldASCII(m, "GPU"):
		return kvevents.TierDevice
	case m == "CPU" || equalFoldASCII(m, "CPU") || equalFoldASCII(m, "CPU_PINNED"):
		return kvevents.TierHost
	case equalFoldASCII(m, "DISK"):
		return kvevents.TierDisk
	}
	return kvevents.TierExternal
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

// readHash reads a block hash in any of its wire forms: an unsigned
// integer, a negative signed integer (reinterpreted as its two's
// complement), or bytes (the last 8 bytes big-endian; fewer than 8 bytes are
// read as a shorter big-endian number, like Python's
// int.from_bytes(h, "big") & (2**64-1)).
func readHash(r *msgpack.Reader) (kvevents.EngineHash, error) {
	c, err := r.Peek()
	if err != nil {
		return 0, err
	}
	if msgpack.IsBin(c) {
		p, err := r.Bin()
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
		return kvevents.EngineHash(v), nil
	}
	v, _, err := r.Integer()
	return kvevents.EngineHash(v), err
}
