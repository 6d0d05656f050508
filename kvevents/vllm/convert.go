package vllm

import (
	"errors"
	"fmt"

	"github.com/kvrouter/kvrouter/kvevents"
)

// This file converts decoded vLLM events into kvevents.Events: token_ids
// hashed into sequence hashes, children chained onto their parents'.

// Conversion errors, wrapped with the event's position by Convert.
var (
	// ErrUnknownParent: a BlockStored's parent_block_hash is not a block
	// this converter has seen stored (and not yet removed), so its sequence
	// hashes cannot be computed. The event is skipped, never guessed.
	ErrUnknownParent = errors.New("vllm: unknown parent block")
	// ErrBlockSizeMismatch: a BlockStored's block_size differs from the
	// converter's configured block size. The event is skipped.
	ErrBlockSizeMismatch = errors.New("vllm: block size mismatch")
	// ErrTokenCount: token_ids does not hold exactly len(block_hashes) *
	// block_size tokens. The event is skipped.
	ErrTokenCount = errors.New("vllm: token count does not match blocks")
	// ErrBadMedia: a BlockStored's multimodal extra keys are not
	// (identifier, offset) pairs of its blocks, so its hashes cannot be
	// known. The event is skipped, never hashed without them.
	ErrBadMedia = errors.New("vllm: unreadable multimodal extra keys")
)

// ConverterConfig configures a Converter.
type ConverterConfig struct {
	// BlockSize is the engine's KV block size in tokens (vLLM default 16).
	// Required.
	BlockSize int
	// MaxTracked bounds the engine-hash table (default 1<<21 entries, a few
	// times any real engine's cache). If it is exceeded the table is reset
	// and counted, and later children of forgotten blocks are reported as
	// unknown parents. In SeqKeyed mode the reset also returns a KindCleared
	// before the event that caused it: a forgotten block's removal could no
	// longer be translated, so routers must not keep it.
	MaxTracked int
	// AllGroups keeps events of every KV cache group. By default events whose
	// kv_cache_spec_kind is set and is not "full_attention" (sliding-window
	// and mamba groups of hybrid models) are skipped: their blocks cannot be
	// prefix-matched.
	AllGroups bool
	// SeqKeyed makes Convert return sequence-keyed events, for a
	// kvevents.Publisher with PublisherConfig.SeqKeyed (the two must agree:
	// the publisher refuses events of the other keying). Stored events name
	// only the (sequence hash, tier) blocks new to their tier and removals
	// only those the tier no longer holds (kvevents.Batch.SeqKeyed), so the
	// converter counts each (sequence hash, tier)'s engine blocks.
	SeqKeyed bool
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
	Multimodal     uint64 // BlockStored events whose multimodal extra keys were hashed in
	BadMedia       uint64 // BlockStored events skipped: unreadable multimodal extra keys
	TableResets    uint64 // times the engine-hash table hit MaxTracked (SeqKeyed: each returned a KindCleared)

	// SeqKeyed mode only.
	SeqStored      uint64 // (sequence hash, tier) blocks announced stored: their count went 0 -> 1
	SeqRemoved     uint64 // (sequence hash, tier) blocks announced removed: their count went 1 -> 0
	Duplicates     uint64 // stored engine blocks the tier already held with the same sequence hash
	Rebound        uint64 // stored engine blocks whose engine hash was known with another sequence hash
	EmptyStored    uint64 // BlockStored events with no block new to its tier: not returned
	EmptyRemoved   uint64 // BlockRemoved events that left every (sequence hash, tier) held: not returned
	UnknownRemoved uint64 // removed engine hashes not held on the event's tier: dropped
}

// Converter turns decoded vLLM batches of ONE engine (one worker and DP
// rank: engine hashes are only meaningful per engine) into kvevents.Events.
// It hashes token_ids into sequence hashes and remembers engine hash ->
// sequence hash for every stored block, so a later BlockStored whose parent
// is a known block continues that block's chain (and its LoRA/salt seed).
// In SeqKeyed mode it also counts, per (sequence hash, tier), the engine
// blocks that hold it, and translates removals itself: routers then keep
// a set of sequence hashes per tier instead of a map per worker.
// Not safe for concurrent use.
type Converter struct {
	cfg    ConverterConfig
	known  map[kvevents.EngineHash]convEntry
	blocks []kvevents.StoredBlock
	seqs   []kvevents.SeqHash
	stats  ConverterStats

	// SeqKeyed mode only. counts is one map keyed by the small comparable
	// seqTier rather than a map per tier: one lookup per block, no inner
	// map to allocate when a tier first appears, one clear to forget
	// everything. A key is present while its count is >= 1.
	counts  map[seqTier]uint32
	removed []kvevents.SeqHash // RemovedSeqs of this Convert's events
	lost    []seqTier          // what one BlockStored's rebinding left empty
}

// seqTier is a (sequence hash, tier) block as routers hold it.
type seqTier struct {
	seq  kvevents.SeqHash
	tier kvevents.Tier
}

// convEntry is what the converter knows about one engine block.
type convEntry struct {
	seq  kvevents.SeqHash
	seed uint64 // the local-hash seed of its chain, inherited by children
	// tiers has a bit per tier that holds a copy; the entry goes when none
	// do. In SeqKeyed mode, after RoutersCleared, an entry the engine still
	// holds stays with no bit (kept for its children's chains, announced
	// to no tier) until it is stored or removed again.
	tiers uint8
}

// NewConverter returns a converter for an engine with cfg.BlockSize.
func NewConverter(cfg ConverterConfig) (*Converter, error) {
	if cfg.BlockSize < 1 || cfg.BlockSize > maxBlockSize {
		return nil, fmt.Errorf("vllm: converter block size %d out of range", cfg.BlockSize)
	}
	if cfg.MaxTracked <= 0 {
		cfg.MaxTracked = 1 << 21
	}
	c := &Converter{cfg: cfg, known: make(map[kvevents.EngineHash]convEntry)}
	if cfg.SeqKeyed {
		c.counts = make(map[seqTier]uint32)
	}
	return c, nil
}

// Stats returns the converter's counters.
func (c *Converter) Stats() ConverterStats { return c.stats }

// Tracked returns how many engine blocks the converter currently knows.
func (c *Converter) Tracked() int { return len(c.known) }

// Convert appends to dst the kvevents.Events of the usable events of vb, in
// order, and returns it.
//
// Engine-keyed (the default): one event per usable vLLM event. Stored
// events carry the engine hash (for later parents and removals) and the
// sequence hash of every block; Removed events carry engine hashes;
// AllBlocksCleared becomes KindCleared and forgets every block.
//
// SeqKeyed: Stored events carry only sequence hashes (no Engine, no
// Parent), and only of blocks new to their tier; Removed events carry
// RemovedSeqs, the sequence hashes their tier no longer holds. A
// BlockStored that names only blocks already held returns nothing, as does
// a BlockRemoved that empties no (sequence hash, tier), or one of engine
// hashes the converter does not hold on that tier (it never announced
// them). A BlockStored that rebinds an engine hash to other content first
// returns a Removed per tier the old content left, and one that resets the
// table (MaxTracked) first returns a KindCleared.
//
// Events that cannot be converted are skipped and counted; the
// returned error then describes the first of them (wrapping
// ErrUnknownParent, ErrBlockSizeMismatch, ErrTokenCount or ErrBadMedia), while the
// returned events are still valid and should be published. Only stored
// events fail, so a failure under-counts and never leaves a block the
// engine dropped: every removal and clear is returned, whatever its
// hashes. Remote and non-full-attention events are skipped stores and
// removals alike, so routers never held what such a removal drops. The
// one skip that may hide a removal is an event of an unknown type (Kind
// 0, counted as UnknownTag); a caller that must never keep a dropped
// block clears the engine after it (the bridge resyncs). The Blocks,
// Removed and RemovedSeqs slices alias the converter's and vb's buffers:
// they are valid until the next Convert or the next decode into vb.
func (c *Converter) Convert(vb *Batch, dst []kvevents.Event) ([]kvevents.Event, error) {
	var first error
	n0 := len(dst)
	c.blocks, c.removed = c.blocks[:0], c.removed[:0]
	for i := range vb.Events {
		ev := &vb.Events[i]
		if c.skip(ev) {
			continue
		}
		var err error
		switch {
		case ev.Kind == kvevents.KindCleared:
			c.forget()
			c.stats.Clears++
			dst = append(dst, kvevents.Event{Kind: kvevents.KindCleared, Tier: ev.Tier})
		case ev.Kind == kvevents.KindRemoved && c.cfg.SeqKeyed:
			dst = c.removedSeq(ev, dst)
		case ev.Kind == kvevents.KindRemoved:
			dst = c.removedEngine(ev, dst)
		case ev.Kind == kvevents.KindStored && c.cfg.SeqKeyed:
			dst, err = c.storedSeq(ev, dst)
		case ev.Kind == kvevents.KindStored:
			dst, err = c.storedEngine(ev, dst)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("vLLM event %d: %w", i, err)
		}
	}
	c.stats.Events += uint64(len(dst) - n0)
	return dst, first
}

// removedEngine converts one BlockRemoved for an engine-keyed batch: the
// tier leaves each known block (forgotten once no tier holds it), and the
// engine hashes go on for routers to resolve.
func (c *Converter) removedEngine(ev *Event, dst []kvevents.Event) []kvevents.Event {
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
	return append(dst, kvevents.Event{Kind: kvevents.KindRemoved, Tier: ev.Tier, Removed: ev.BlockHashes})
}

// storedEngine converts one BlockStored for an engine-keyed batch.
func (c *Converter) storedEngine(ev *Event, dst []kvevents.Event) ([]kvevents.Event, error) {
	out, blocks, err := c.stored(ev, c.blocks)
	c.blocks = blocks
	if err != nil {
		return dst, err
	}
	return append(dst, out), nil
}

// skip reports (and counts) an event the converter does not convert:
// unknown, remote, or of a group whose blocks cannot be prefix-matched.
func (c *Converter) skip(ev *Event) bool {
	switch {
	case ev.Kind == 0:
		c.stats.UnknownTag++
	case ev.Remote:
		c.stats.SkippedRemote++
	case !c.cfg.AllGroups && ev.SpecKind != "" && ev.SpecKind != "full_attention":
		c.stats.SkippedGroup++
	default:
		return false
	}
	return true
}

func tierBit(t kvevents.Tier) uint8 {
	if t > 7 {
		t = 7
	}
	return 1 << t
}

// hash checks a BlockStored and puts its blocks' sequence hashes in
// c.seqs, returning the seed its blocks' children inherit.
func (c *Converter) hash(ev *Event) (uint64, error) {
	bs := c.cfg.BlockSize
	if ev.BlockSize != bs {
		c.stats.BlockSizeError++
		return 0, fmt.Errorf("%w: event block_size %d, configured %d", ErrBlockSizeMismatch, ev.BlockSize, bs)
	}
	if len(ev.TokenIDs) != len(ev.BlockHashes)*bs {
		c.stats.TokenCount++
		return 0, fmt.Errorf("%w: %d tokens for %d blocks of %d", ErrTokenCount, len(ev.TokenIDs), len(ev.BlockHashes), bs)
	}
	if ev.BadMedia {
		c.stats.BadMedia++
		return 0, fmt.Errorf("%w: a multimodal entry is not an (identifier, offset) pair", ErrBadMedia)
	}
	var seed uint64
	var parent kvevents.SeqHash
	if ev.HasParent {
		p, ok := c.known[ev.Parent]
		if !ok {
			c.stats.UnknownParent++
			return 0, fmt.Errorf("%w: parent %#016x", ErrUnknownParent, uint64(ev.Parent))
		}
		seed, parent = p.seed, p.seq
		if ev.CacheSalt != "" {
			seed = kvevents.SeedFor(ev.LoraName, ev.CacheSalt)
		}
	} else {
		seed = kvevents.SeedFor(ev.LoraName, ev.CacheSalt)
	}
	switch {
	case len(ev.Media) > 0:
		if err := c.mediaHashes(ev, parent, seed); err != nil {
			c.stats.BadMedia++
			return 0, err
		}
		c.stats.Multimodal++
	case ev.HasParent:
		c.seqs = kvevents.SeqHashesFrom(c.seqs[:0], parent, ev.TokenIDs, bs, seed)
	default:
		c.seqs = kvevents.SeqHashes(c.seqs[:0], ev.TokenIDs, bs, seed)
	}
	return seed, nil
}

func (c *Converter) stored(ev *Event, blocks []kvevents.StoredBlock) (kvevents.Event, []kvevents.StoredBlock, error) {
	seed, err := c.hash(ev)
	if err != nil {
		return kvevents.Event{}, blocks, err
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
		blocks = append(blocks, kvevents.StoredBlock{Engine: h, Seq: s})
	}
	c.stats.StoredBlocks += uint64(len(ev.BlockHashes))
	return kvevents.Event{
		Kind: kvevents.KindStored, Tier: ev.Tier, Parent: ev.Parent, HasParent: ev.HasParent,
		Blocks: blocks[start:len(blocks):len(blocks)],
	}, blocks, nil
}
