package scheduler

// LoRA adapters in the default cost. A request that names an adapter
// (Request.Adapter, the route request's lora_name) runs faster on a worker
// that already holds the adapter on its GPU (Request.AdapterResident, which
// the host reads from the worker registry): elsewhere the engine first loads
// it, which delays the request like AdapterLoadBlocks more blocks of
// prefill (CostParams). Which workers serve the adapter at all is the
// caller's to say (Request.Allowed): this term only weighs loading against
// cache and load.

// DefaultAdapterLoadBlocks is the adapter term's weight when
// CostParams.AdapterLoadBlocks is 0: 128 blocks, 2,048 prompt tokens at
// block size 16, about a quarter of one engine step's token budget at
// vLLM's default of 8,192. An adapter swapped in from the engine's CPU cache
// takes milliseconds to tens of milliseconds; one read from storage takes
// far longer, and the adapter it displaces may be needed next. Not yet
// measured against traces with adapters: a fleet that knows its load time
// sets adapter_load_blocks to it divided by its prefill time per block.
const DefaultAdapterLoadBlocks = 128

// adapterLoad is the weight of the adapter term for the request being
// selected: 0 when it names no adapter, when no candidate holds it (every
// candidate would pay alike), or when the term is off.
func (cp *CostParams) adapterLoad(c *Candidates) float64 {
	switch {
	case !c.anyAdapter || cp.AdapterLoadBlocks < 0:
		return 0
	case cp.AdapterLoadBlocks == 0:
		return DefaultAdapterLoadBlocks
	}
	return cp.AdapterLoadBlocks
}

// plain reports whether the fast cost loops apply: no prompt blocks shared
// with active requests and no adapter term.
func (c *Candidates) plain() bool { return !c.anyShared && !c.anyAdapter }

// AdapterResident reports whether candidate i holds the request's LoRA
// adapter (always true for a request without one).
func (c *Candidates) AdapterResident(i int) bool {
	return !c.adapter || c.warm[c.slots[i]] >= c.epoch
}

// prepareAdapter stamps the slots of the workers holding r's adapter with
// the selection's epoch (c.cands.warm), as prepare stamps overlaps.
func (c *core) prepareAdapter(r *Request) {
	cs := &c.cands
	cs.adapter, cs.anyAdapter = r.Adapter != "", false
	if !cs.adapter {
		return
	}
	for _, name := range r.AdapterResident {
		wid := c.fl.widOf(name)
		if wid < 0 {
			continue
		}
		for _, s := range c.fl.workers[wid].slots {
			cs.warm[s] = cs.epoch
			cs.anyAdapter = true
		}
	}
}
