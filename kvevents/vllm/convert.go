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
	Multimodal     uint64 // BlockStored events whose multimodal extra keys were hashed in
	BadMedia       uint64 // BlockStored events skipped: unreadable multimodal extra keys
	TableResets    uint64 // times the engine-hash table hit MaxTracked
}

// Converter turns decoded vLLM batches of ONE engine (one worker and DP
// rank: engine hashes are only meaningful per engine) into kvevents.Events.
// It hashes token_ids into sequence hashes and remembers engine hash ->
// sequence hash for every stored block, so a later BlockStored whose parent
// is a known block continues that block's chain (and its LoRA/salt seed).
// Not safe for concurrent use.
type Converter struct {
	cfg    ConverterConfig
	known  map[kvevents.EngineHash]convEntry
	blocks []kvevents.StoredBlock
	seqs   []kvevents.SeqHash
	stats  ConverterStats
}

// convEntry is what the converter knows about one engine block.
type convEntry struct {
	seq   kvevents.SeqHash
	seed  uint64 // the local-hash seed of its chain, inherited by children
	tiers uint8  // bit per tier that holds a copy; the entry goes when none do
}

// NewConverter returns a converter for an engine with cfg.BlockSize.
func NewConverter(cfg ConverterConfig) (*Converter, error) {
	if cfg.BlockSize < 1 || cfg.BlockSize > maxBlockSize {
		return nil, fmt.Errorf("vllm: converter block size %d out of range", cfg.BlockSize)
	}
	if cfg.MaxTracked <= 0 {
		cfg.MaxTracked = 1 << 21
	}
	return &Converter{cfg: cfg, known: make(map[kvevents.EngineHash]convEntry)}, nil
}

// Stats returns the converter's counters.
func (c *Converter) Stats() ConverterStats { return c.stats }

// Tracked returns how many engine blocks the converter currently knows.
func (c *Converter) Tracked() int { return len(c.known) }

// Convert appends to dst one kvevents.Event per usable event of vb, in
// order, and returns it. Stored events carry the engine hash (for later
// parents and removals) and the sequence hash of every block; Removed
// events carry engine hashes; AllBlocksCleared becomes KindCleared and
// forgets every block. Events that cannot be converted are skipped and counted; the
// returned error then describes the first of them (wrapping
// ErrUnknownParent, ErrBlockSizeMismatch, ErrTokenCount or ErrBadMedia), while the
// returned events are still valid and should be published. Only stored
// events fail, so a failure under-counts and never leaves a block the
// engine dropped: every removal and clear is returned, whatever its
// hashes. Remote and non-full-attention events are skipped stores and
// removals alike, so routers never held what such a removal drops. The
// one skip that may hide a removal is an event of an unknown type (Kind
// 0, counted as UnknownTag); a caller that must never keep a dropped
// block clears the engine after it (the bridge resyncs). The Blocks and
// Removed slices alias the converter's and vb's buffers: they are valid
// until the next Convert or the next decode into vb.
func (c *Converter) Convert(vb *Batch, dst []kvevents.Event) ([]kvevents.Event, error) {
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
		case kvevents.KindCleared:
			clear(c.known)
			c.stats.Clears++
			dst = append(dst, kvevents.Event{Kind: kvevents.KindCleared, Tier: ev.Tier})
		case kvevents.KindRemoved:
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
			dst = append(dst, kvevents.Event{Kind: kvevents.KindRemoved, Tier: ev.Tier, Removed: ev.BlockHashes})
		case kvevents.KindStored:
			var err error
			var out kvevents.Event
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

func tierBit(t kvevents.Tier) uint8 {
	if t > 7 {
		t = 7
	}
	return 1 << t
}

func (c *Converter) stored(ev *Event, blocks []kvevents.StoredBlock) (kvevents.Event, []kvevents.StoredBlock, error) {
	bs := c.cfg.BlockSize
	if ev.BlockSize != bs {
		c.stats.BlockSizeError++
		return kvevents.Event{}, blocks, fmt.Errorf("%w: event block_size %d, configured %d", ErrBlockSizeMismatch, ev.BlockSize, bs)
	}
	if len(ev.TokenIDs) != len(ev.BlockHashes)*bs {
		c.stats.TokenCount++
		return kvevents.Event{}, blocks, fmt.Errorf("%w: %d tokens for %d blocks of %d", ErrTokenCount, len(ev.TokenIDs), len(ev.BlockHashes), bs)
	}
	if ev.BadMedia {
		c.stats.BadMedia++
		return kvevents.Event{}, blocks, fmt.Errorf("%w: a multimodal entry is not an (identifier, offset) pair", ErrBadMedia)
	}
	var seed uint64
	var parent kvevents.SeqHash
	if ev.HasParent {
		p, ok := c.known[ev.Parent]
		if !ok {
			c.stats.UnknownParent++
			return kvevents.Event{}, blocks, fmt.Errorf("%w: parent %#016x", ErrUnknownParent, uint64(ev.Parent))
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
			return kvevents.Event{}, blocks, err
		}
		c.stats.Multimodal++
	case ev.HasParent:
		c.seqs = kvevents.SeqHashesFrom(c.seqs[:0], parent, ev.TokenIDs, bs, seed)
	default:
		c.seqs = kvevents.SeqHashes(c.seqs[:0], ev.TokenIDs, bs, seed)
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
