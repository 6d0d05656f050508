package sim

import (
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
)

// This file models LoRA adapters on a rank as vLLM's v1 engine holds them:
// at most Config.MaxLoRAs on the GPU at once, least recently used out; one
// scheduler step runs requests of at most MaxLoRAs distinct adapters (a
// waiting request whose adapter would be one too many is skipped and keeps
// its place, vLLM's max_loras check); and a step whose batch needs an
// adapter not held loads it first, which the step pays for in
// Config.LoRALoadTime of model time per adapter. An adapter's KV blocks are
// its own: its name is in the hash seed (Request.LoRA), as vLLM puts it in
// every block's extra keys.

// BlockKeys is what a Stored event's blocks were hashed with besides their
// tokens, for emitters that publish it (vLLM's lora_name, lora_id and
// extra_keys).
type BlockKeys struct {
	LoRA   string // adapter name; "" = the base model
	LoRAID int    // the adapter's integer id; 0 = none
	// CacheSalt is the request's salt, set only when the event's first
	// block is the sequence's first: vLLM puts the salt in the extra keys
	// of the block at token 0 alone (later blocks inherit it by the chain).
	CacheSalt string
	// Media holds the (identifier, offset) pairs of the event's blocks
	// (Block counted from the event's first block), where vLLM writes them
	// in extra_keys (media.go).
	Media []kvevents.MediaKey
}

// keysFrom returns the keys of r's blocks from block index start on.
func (r *request) keysFrom(start int) BlockKeys {
	k := BlockKeys{LoRA: r.lora, LoRAID: r.loraID}
	if start == 0 {
		k.CacheSalt = r.salt
	}
	return k
}

// loraSlots is one rank's GPU adapter slots.
type loraSlots struct {
	resident []string // least recently used first
	step     []string // scratch: the distinct adapters of the step being planned
}

// LoRAState is one rank's adapters.
type LoRAState struct {
	Resident []string // held on the GPU, least recently used first
	Running  []string // distinct adapters of running requests, sorted
	Waiting  []string // distinct adapters of waiting requests, sorted
	Loads    uint64   // adapters loaded since New
}

// LoRAState returns each rank's adapters (nothing useful unless
// Config.MaxLoRAs > 0, but Running and Waiting are always filled).
func (e *Engine) LoRAState() []LoRAState {
	out := make([]LoRAState, len(e.ranks))
	for i, c := range e.ranks {
		c.mu.Lock()
		out[i] = LoRAState{
			Resident: slices.Clone(c.lora.resident),
			Running:  adaptersOf(c.running),
			Waiting:  adaptersOf(c.waiting),
			Loads:    c.stats.LoRALoads,
		}
		c.mu.Unlock()
	}
	return out
}

// RemoveLoRA drops adapter name from every rank's GPU slots (vLLM's
// remove_lora, behind /v1/unload_lora_adapter). Requests already running
// with it finish; a later one loads it again.
func (e *Engine) RemoveLoRA(name string) {
	for _, c := range e.ranks {
		c.mu.Lock()
		c.lora.resident = slices.DeleteFunc(c.lora.resident, func(s string) bool { return s == name })
		c.mu.Unlock()
	}
}

// adaptersOf returns the distinct adapters of rs, sorted (nil for none).
func adaptersOf(rs []*request) []string {
	var out []string
	for _, r := range rs {
		if r.lora != "" && !slices.Contains(out, r.lora) {
			out = append(out, r.lora)
		}
	}
	slices.Sort(out)
	return out
}

// loraFits reports whether r may join the step being planned: always
// without adapter modelling or without an adapter; otherwise when its
// adapter is already in the step or the step has fewer than MaxLoRAs.
func (c *core) loraFits(r *request) bool {
	if c.cfg.MaxLoRAs <= 0 || r.lora == "" {
		return true
	}
	step := c.stepAdapters()
	return len(step) < c.cfg.MaxLoRAs || slices.Contains(step, r.lora)
}

// stepAdapters returns the distinct adapters of the requests planned so
// far in this step (c.plan).
func (c *core) stepAdapters() []string {
	step := c.lora.step[:0]
	for _, p := range c.plan {
		if p.lora != "" && !slices.Contains(step, p.lora) {
			step = append(step, p.lora)
		}
	}
	c.lora.step = step
	return step
}

// loadAdapters makes the planned step's adapters resident, loading those
// that are not (evicting the least recently used others beyond MaxLoRAs),
// and returns the model time the loads take.
func (c *core) loadAdapters() time.Duration {
	if c.cfg.MaxLoRAs <= 0 {
		return 0
	}
	step := c.stepAdapters()
	loads := 0
	for _, name := range step {
		if i := slices.Index(c.lora.resident, name); i >= 0 {
			c.lora.resident = append(slices.Delete(c.lora.resident, i, i+1), name) // most recent
			continue
		}
		c.lora.resident = append(c.lora.resident, name)
		loads++
	}
	for i := 0; len(c.lora.resident) > c.cfg.MaxLoRAs && i < len(c.lora.resident); {
		if slices.Contains(step, c.lora.resident[i]) {
			i++ // in use by this step: never out
			continue
		}
		c.lora.resident = slices.Delete(c.lora.resident, i, i+1)
	}
	c.stats.LoRALoads += uint64(loads)
	return time.Duration(loads) * c.cfg.LoRALoadTime
}

// takeWaiting removes waiting request i (it is being admitted). The head
// leaves by reslicing, as it nearly always does; a request admitted past
// skipped ones (loraFits) is cut out, keeping the queue's order.
func (c *core) takeWaiting(i int) {
	if i == 0 {
		c.waiting[0] = nil
		c.waiting = c.waiting[1:]
		return
	}
	c.waiting = slices.Delete(c.waiting, i, i+1)
}
