package sim

import (
	"github.com/kvrouter/kvrouter/workers"
)

// Load returns the current load of each rank, in rank order, ready for
// workers.PublishLoad or a workers.LoadReporter's Source. KVUsedBlocks counts
// blocks held by running requests (Dynamo's active blocks); cached blocks
// nobody holds are reusable and count as free. PrefillTokens counts the
// tokens still to compute of running requests in prefill and of queued ones.
// A queued request counts only its uncached part: its prompt minus the
// prefix the cache holds at report time, found by the same lookup admission
// makes (one map probe per leading block, stopping at the first miss). A
// request the cache will serve mostly from its prefix therefore does not
// make the worker look busy to the router, which keeps reported minus booked
// prefill as a correction until the next report.
func (e *Engine) Load() []workers.LoadReport {
	out := make([]workers.LoadReport, len(e.ranks))
	for i, c := range e.ranks {
		c.mu.Lock()
		out[i] = c.load()
		c.mu.Unlock()
	}
	return out
}

func (c *core) load() workers.LoadReport {
	l := workers.LoadReport{
		Model:           c.model,
		Worker:          c.key.Worker,
		Rank:            c.key.Rank,
		ActiveRequests:  len(c.running),
		WaitingRequests: len(c.waiting),
		KVUsedBlocks:    c.cache.active(),
		KVTotalBlocks:   c.cache.total(),
		At:              c.clock.Now(),
	}
	for _, r := range c.running {
		if !r.decoding() {
			l.PrefillTokens += len(r.tokens) - r.computed
		}
	}
	for _, r := range c.waiting {
		l.PrefillTokens += len(r.tokens) - c.cachedPrefix(r)
	}
	return l
}

// cachedPrefix is the number of r's tokens admission would find cached now:
// whole leading blocks present in the cache, at most up to the block before
// the last token (as vLLM, the last token is always computed). The caller
// holds c.mu.
func (c *core) cachedPrefix(r *request) int {
	hit, _ := c.prefixHits(r)
	return max(hit*c.cfg.BlockSize, r.computed)
}

// InFlight is the number of requests queued or running on all ranks (for
// workers.DrainConfig.InFlight).
func (e *Engine) InFlight() int {
	n := 0
	for _, c := range e.ranks {
		c.mu.Lock()
		n += len(c.running) + len(c.waiting)
		c.mu.Unlock()
	}
	return n
}

// Info describes the engine for workers.Register: identity, endpoint,
// capacity and the current epoch. State is left empty (Register makes it
// ready). The label engine=sim marks simulated workers.
func (e *Engine) Info() workers.Info {
	ranks := make([]uint32, len(e.ranks))
	for i := range ranks {
		ranks[i] = uint32(i)
	}
	return workers.Info{
		ID:               e.cfg.Worker,
		Model:            e.cfg.Model,
		Endpoint:         e.Endpoint(),
		Ranks:            ranks,
		BlockSize:        e.cfg.BlockSize,
		KVBlocks:         e.cfg.KVBlocks,
		MaxBatchedTokens: e.cfg.MaxBatchedTokens,
		MaxSeqs:          e.cfg.MaxSeqs,
		Epoch:            e.Epoch(),
		Labels:           map[string]string{"engine": "sim"},
		Role:             e.cfg.Role,
	}
}
