package kvevents

import (
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"
)

// Multimodal items in the block hash, as vLLM keys them
// (kv_cache_utils._gen_mm_extra_hash_keys): every block that overlaps an
// item's placeholder tokens gets the pair (identifier, offset) in its extra
// keys, offset being the item's first placeholder position minus the
// block's first token position (negative when the item began in an earlier
// block). Placeholder tokens are equal for different images, so without the
// pairs two prompts with different images would share every block.
//
// Router-side, each pair is mixed into the block's local hash (MixMedia),
// in the block's order of pairs, before the block is chained. Routers know
// a prompt's items (MediaItem: positions and identifiers) and hash with
// SeqHashesMedia; engines publish the pairs per block (MediaKey, decoded
// from BlockStored.extra_keys) and are rehashed with SeqHashesKeyed. Both
// give the same hashes for the same items (tested), and both equal
// SeqHashes when there are no items.

// MediaItem is one multimodal item of a prompt (an image, an audio clip):
// the range of its placeholder tokens and the identifier the engine hashes
// into the blocks that overlap it.
type MediaItem struct {
	// ID is the engine's identifier of the item, the one it publishes in
	// extra_keys: vLLM's multimodal hash, or the client's uuid for the
	// content part. "" means unknown: SeqHashesMedia then stops before the
	// first block that overlaps the item, since that block's hash cannot
	// be known.
	ID     string `json:"id,omitempty"`
	Offset int    `json:"offset"` // position of the item's first placeholder token in the prompt
	Length int    `json:"length"` // placeholder tokens, at least 1
}

// MediaKey is one (identifier, offset) pair of one block's extra keys, as
// an engine publishes it: Block is the block's index counted from the first
// block of the run being hashed, Offset the item's start minus the block's
// start (negative when the item began in an earlier block).
type MediaKey struct {
	Block  int
	ID     string
	Offset int
}

// MixMedia returns a block's local hash with one (identifier, offset) pair
// mixed in:
//
//	XXH3-64(LE64(local) || LE64(XXH3-64(id, seed 0)) || LE64(offset), seed HashSeed)
//
// with offset as a two's-complement 64-bit integer. A block with several
// pairs applies them in order.
func MixMedia(local uint64, id string, offset int) uint64 {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:8], local)
	binary.LittleEndian.PutUint64(b[8:16], xxh3.HashString(id))
	binary.LittleEndian.PutUint64(b[16:24], uint64(int64(offset)))
	return xxh3.HashSeed(b[:], HashSeed)
}

// SeqHashesMedia is SeqHashes for a prompt with multimodal items, their
// positions counted from tokens[0]. Items must be sorted by Offset and not
// overlap, each with Length >= 1 (callers validate untrusted lists). The
// hashes stop before the first block overlapping an item whose ID is
// unknown (""): the caller then routes on the blocks before it and never
// claims more. Without items it is SeqHashes, and as allocation-free.
func SeqHashesMedia(dst []SeqHash, tokens []uint32, blockSize int, seed uint64, items []MediaItem) []SeqHash {
	if len(items) == 0 {
		return SeqHashes(dst, tokens, blockSize, seed)
	}
	return seqHashesMedia(dst, 0, false, tokens, 0, blockSize, seed, items)
}

// SeqHashesFromMedia is SeqHashesFrom with multimodal items: tokens[0] is
// at position start of the sequence (a multiple of blockSize), and item
// positions are counted from the sequence's first token, so an engine can
// extend a request's hashes block by block.
func SeqHashesFromMedia(dst []SeqHash, parent SeqHash, tokens []uint32, start, blockSize int, seed uint64, items []MediaItem) []SeqHash {
	if len(items) == 0 {
		return SeqHashesFrom(dst, parent, tokens, blockSize, seed)
	}
	return seqHashesMedia(dst, parent, true, tokens, start, blockSize, seed, items)
}

func seqHashesMedia(dst []SeqHash, prev SeqHash, chained bool, tokens []uint32, start, blockSize int, seed uint64, items []MediaItem) []SeqHash {
	if blockSize < 1 {
		return dst
	}
	n := len(tokens) / blockSize
	dst = slices.Grow(dst, n)
	lo := 0
	for b := 0; b < n; b++ {
		s := start + b*blockSize
		local := LocalBlockHash(tokens[b*blockSize:(b+1)*blockSize], seed)
		var hi int
		lo, hi = overlapping(items, lo, s, blockSize)
		for _, it := range items[lo:hi] {
			if it.ID == "" {
				return dst
			}
			local = MixMedia(local, it.ID, it.Offset-s)
		}
		prev, chained = chain(prev, chained, local), true
		dst = append(dst, prev)
	}
	return dst
}

// chain is the sequence hash of a block with local hash local: local
// itself at a sequence's start (chained false), else chained onto prev.
func chain(prev SeqHash, chained bool, local uint64) SeqHash {
	if !chained {
		return SeqHash(local)
	}
	return NextSeqHash(prev, local)
}

// SeqHashesKeyed hashes blocks as an engine reported them: keys are the
// (identifier, offset) pairs of the blocks, sorted by Block (counted from
// tokens[0]'s block), in each block's order; keys of blocks past the
// tokens are ignored. With hasParent the first block is chained onto
// parent (SeqHashesFrom), otherwise it starts a sequence (SeqHashes).
// Without keys it is SeqHashes or SeqHashesFrom.
func SeqHashesKeyed(dst []SeqHash, parent SeqHash, hasParent bool, tokens []uint32, blockSize int, seed uint64, keys []MediaKey) []SeqHash {
	switch {
	case len(keys) == 0 && hasParent:
		return SeqHashesFrom(dst, parent, tokens, blockSize, seed)
	case len(keys) == 0:
		return SeqHashes(dst, tokens, blockSize, seed)
	case blockSize < 1:
		return dst
	}
	n := len(tokens) / blockSize
	dst = slices.Grow(dst, n)
	prev, chained, k := parent, hasParent, 0
	for b := 0; b < n; b++ {
		local := LocalBlockHash(tokens[b*blockSize:(b+1)*blockSize], seed)
		for k < len(keys) && keys[k].Block < b {
			k++ // out of order: not a pair of this block or a later one
		}
		for ; k < len(keys) && keys[k].Block == b; k++ {
			local = MixMedia(local, keys[k].ID, keys[k].Offset)
		}
		prev, chained = chain(prev, chained, local), true
		dst = append(dst, prev)
	}
	return dst
}

// AppendMediaKeys appends the (identifier, offset) pairs of blocks blocks
// starting at token position start (a multiple of blockSize) of a
// sequence with items (positions counted from the sequence's start), Block
// counted from the first of them: what an engine publishes in those blocks'
// extra_keys. Items must be sorted and disjoint, as for SeqHashesMedia.
func AppendMediaKeys(dst []MediaKey, items []MediaItem, start, blocks, blockSize int) []MediaKey {
	lo := 0
	for b := 0; b < blocks; b++ {
		s := start + b*blockSize
		var hi int
		lo, hi = overlapping(items, lo, s, blockSize)
		for _, it := range items[lo:hi] {
			dst = append(dst, MediaKey{Block: b, ID: it.ID, Offset: it.Offset - s})
		}
	}
	return dst
}

// overlapping returns the items [lo, hi) that overlap the block of
// blockSize tokens at position s, searching from from (the items before it
// end at or before s). Items are sorted and disjoint, so those from lo on
// end after s, and the ones that start before the block's end are exactly
// the block's: vLLM's rule, a block gets an item when it holds at least one
// of its placeholder tokens.
func overlapping(items []MediaItem, from, s, blockSize int) (lo, hi int) {
	lo = from
	for lo < len(items) && items[lo].Offset+items[lo].Length <= s {
		lo++
	}
	hi = lo
	for hi < len(items) && items[hi].Offset < s+blockSize {
		hi++
	}
	return lo, hi
}
