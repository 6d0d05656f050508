package sim

// KV transfer between engines (prefill/decode disaggregation, docs/pd.md):
// a decode engine admits a request whose leading prompt blocks arrived
// from a prefill engine (Request.Transferred) as computed, caches them and
// publishes them as Stored, and computes only the rest. The faces model
// the transfer's time and protocol (vllmapi's kv_transfer_params); the core
// only skips the work.

import (
	"fmt"

	"github.com/kvrouter/kvrouter/kvevents"
)

// HeldPrefix returns the physical block ids of the leading full prompt
// blocks of req that rank req.Rank holds in its cache (in use or cached),
// in order: the blocks a prefill engine names to its decode engine, and
// the ones a decode engine need not pull.
func (e *Engine) HeldPrefix(req Request) ([]int32, error) {
	if int(req.Rank) >= len(e.ranks) {
		return nil, fmt.Errorf("%w: rank %d of %d on %s", ErrBadRank, req.Rank, len(e.ranks), e.cfg.Worker)
	}
	c := e.ranks[req.Rank]
	bs := c.cfg.BlockSize
	full := len(req.Tokens) / bs
	hashes := kvevents.SeqHashesMedia(nil, req.Tokens[:full*bs], bs, kvevents.SeedFor(req.LoRA, req.CacheSalt), req.Media)
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int32
	for _, h := range hashes {
		b, ok := c.cache.lookup(h)
		if !ok {
			break
		}
		out = append(out, b)
	}
	return out, nil
}

// transferStart is where r's computation starts at its first admission
// when its prompt's first r.transferred blocks arrived by transfer and the
// cache holds the first hit: after the transferred blocks, but, as vLLM,
// never past the block of the prompt's last token (computed for its
// logits).
func (c *core) transferStart(r *request, hit int) int {
	if r.admitted || r.transferred <= hit {
		return hit
	}
	return max(hit, min(r.transferred, (len(r.tokens)-1)/c.cfg.BlockSize))
}

// adoptTransferred makes r's blocks hit..start, just allocated, computed
// (their KV came from the prefill engine): they are cached and published
// as Stored like blocks the engine computed.
func (c *core) adoptTransferred(r *request, hit, start int) {
	if start <= hit {
		return
	}
	r.computed = start * c.cfg.BlockSize
	c.register(r, hit*c.cfg.BlockSize)
	c.stats.TransferredBlocks += uint64(start - hit)
}
