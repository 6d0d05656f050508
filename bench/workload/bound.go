package workload

// Bound is the prefix reuse an infinite cache shared by the whole fleet would
// get on a workload: the fraction of prompt blocks that an earlier request
// already computed. No router can reuse more, so measured hit ratios are
// reported as a fraction of it.
type Bound struct {
	BlockSize      int     `json:"block_size"`      // tokens per counted block; 0 = trace blocks (ids)
	PromptBlocks   int64   `json:"prompt_blocks"`   // blocks counted over all requests
	ReusableBlocks int64   `json:"reusable_blocks"` // of which an earlier request had the same prefix
	Ratio          float64 `json:"ratio"`           // ReusableBlocks / PromptBlocks
}

func (b *Bound) finish() Bound {
	if b.PromptBlocks > 0 {
		b.Ratio = float64(b.ReusableBlocks) / float64(b.PromptBlocks)
	}
	return *b
}

// UpperBound counts full engine blocks of blockSize tokens, the unit an
// engine caches and the unit hit ratios are measured in (a partial last block
// is never cached). For block-id workloads an engine block is identified by the
// id holding its last token and its end offset in that id, which is exact
// because an id names its whole prefix.
func (w *Workload) UpperBound(blockSize int) Bound {
	b := Bound{BlockSize: blockSize}
	if blockSize <= 0 {
		return b
	}
	if w.BlockTokens > 0 {
		seen := make(map[blockKey]struct{})
		for i := range w.Requests {
			r := &w.Requests[i]
			full := r.InputLength / blockSize
			for k := 0; k < full; k++ {
				end := (k + 1) * blockSize
				j := (end - 1) / w.BlockTokens
				if j >= len(r.BlockIDs) {
					break
				}
				key := blockKey{id: r.BlockIDs[j], end: uint32(end - j*w.BlockTokens)}
				b.PromptBlocks++
				if _, ok := seen[key]; ok {
					b.ReusableBlocks++
				} else {
					seen[key] = struct{}{}
				}
			}
		}
		return b.finish()
	}
	seen := make(map[uint64]struct{})
	var hashes []uint64
	for i := range w.Requests {
		hashes = ChainHashes(hashes[:0], w.Requests[i].Tokens, blockSize)
		for _, h := range hashes {
			b.PromptBlocks++
			if _, ok := seen[h]; ok {
				b.ReusableBlocks++
			} else {
				seen[h] = struct{}{}
			}
		}
	}
	return b.finish()
}

type blockKey struct {
	id  uint64
	end uint32
}

// TraceBound counts a block-id workload in its own ids, partial last blocks
// included: the figure the Mooncake provenance quotes (36.6 % for the
// conversation trace). It is zero for token workloads.
func (w *Workload) TraceBound() Bound {
	b := Bound{}
	seen := make(map[uint64]struct{})
	for i := range w.Requests {
		for _, id := range w.Requests[i].BlockIDs {
			b.PromptBlocks++
			if _, ok := seen[id]; ok {
				b.ReusableBlocks++
			} else {
				seen[id] = struct{}{}
			}
		}
	}
	return b.finish()
}

// ChainHashes appends one hash per full block of tokens, each covering the
// block and everything before it (like the router's sequence hashes, but
// private to this package: it only has to tell prefixes apart).
func ChainHashes(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	var prev uint64 = 0x9e3779b97f4a7c15
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		h := prev
		for _, t := range tokens[start : start+blockSize] {
			h ^= uint64(t)
			h *= 0x100000001b3
		}
		prev = mix64(h ^ prev)
		dst = append(dst, prev)
	}
	return dst
}

// mix64 is splitmix64's finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
