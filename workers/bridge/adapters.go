package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/workers"
)

// This file tells the fleet which LoRA adapters the engine serves and which
// it holds on its GPU (workers.Info.Adapters, LoadedAdapters, MaxLoRAs):
//
//   - served: the engine's GET /v1/models, the cards whose parent is the
//     bridge's model (vLLM lists each adapter under its name, its parent
//     the base model), read at start and on every health check, so adapters
//     loaded or unloaded at run time are seen within HealthInterval;
//   - loaded: vLLM holds --max-loras adapters on the GPU, least recently
//     used out, and exports neither the set nor its order. What it does
//     export says which adapters ran last: each BlockStored of an adapter's
//     request carries lora_name, and vllm:lora_requests_info lists the
//     adapters of the running requests (and max_lora, the slot count). The
//     bridge keeps the adapters it saw in use, most recent last, and
//     reports the last max_lora of them as loaded: the engine's own LRU,
//     as far as the events and scrapes show it. An engine restart empties
//     it. A request for an adapter that stores no block (a prompt shorter
//     than one block) and ends between two scrapes goes unseen.
//
// The registry is written only when the lists change, from the scrape
// loop (Registration.SetAdapters).

// maxModelsBytes bounds one /v1/models body.
const maxModelsBytes = 4 << 20

// loraInfo is what a scrape read of vllm:lora_requests_info.
type loraInfo struct {
	running  []string // adapters of the running requests
	maxLoRAs int      // max_lora; 0 when the engine exports none
}

// loraInfoOf reads the family's latest series: vLLM sets the gauge to the
// time on each update, and a series whose labels changed stays exported
// with its old time, so the highest value is the current one (as GIE's
// endpoint picker reads it).
func loraInfoOf(fam *dto.MetricFamily) loraInfo {
	var best *dto.Metric
	for _, m := range fam.GetMetric() {
		if best == nil || value(m) > value(best) {
			best = m
		}
	}
	var li loraInfo
	for _, lp := range best.GetLabel() {
		switch lp.GetName() {
		case "running_lora_adapters":
			for _, s := range strings.Split(lp.GetValue(), ",") {
				if s = strings.TrimSpace(s); s != "" {
					li.running = append(li.running, s)
				}
			}
		case "max_lora":
			li.maxLoRAs, _ = strconv.Atoi(lp.GetValue())
		}
	}
	return li
}

func value(m *dto.Metric) float64 {
	if m.GetGauge() != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetUntyped().GetValue()
}

// adapterTracker is the bridge's view of the engine's adapters. The rank
// followers, the scrape loop and the health loop all feed it.
type adapterTracker struct {
	mu       sync.Mutex
	served   []string
	recent   []string // adapters seen in use, least recent first
	maxLoRAs int
}

// used moves name to the most recent end.
func (a *adapterTracker) usedLocked(name string) {
	if i := slices.Index(a.recent, name); i >= 0 {
		if i == len(a.recent)-1 {
			return
		}
		a.recent = slices.Delete(a.recent, i, i+1)
	}
	a.recent = append(a.recent, name)
	if len(a.recent) > workers.MaxAdapters {
		a.recent = slices.Delete(a.recent, 0, len(a.recent)-workers.MaxAdapters)
	}
}

// noteBatch records the adapters whose blocks a batch stored. The common
// batch, of base-model blocks only, takes no lock.
func (a *adapterTracker) noteBatch(vb *vllm.Batch) {
	locked := false
	for i := range vb.Events {
		ev := &vb.Events[i]
		if ev.Kind != kvevents.KindStored || ev.LoraName == "" {
			continue
		}
		if !locked {
			a.mu.Lock()
			locked = true
		}
		a.usedLocked(ev.LoraName)
	}
	if locked {
		a.mu.Unlock()
	}
}

// scraped records a scrape's running adapters and slot count.
func (a *adapterTracker) scraped(li loraInfo) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, name := range li.running {
		a.usedLocked(name)
	}
	if li.maxLoRAs > 0 {
		a.maxLoRAs = li.maxLoRAs
	}
}

// restarted forgets what the engine held: a new process has loaded nothing.
func (a *adapterTracker) restarted() {
	a.mu.Lock()
	a.recent = a.recent[:0]
	a.mu.Unlock()
}

func (a *adapterTracker) setServed(served []string) {
	a.mu.Lock()
	a.served = served
	a.mu.Unlock()
}

// lists returns what the registry should say: the served adapters, the
// loaded ones (the last max_lora used, vLLM's default of one slot when the
// engine does not say) and the slot count.
func (a *adapterTracker) lists() (served, loaded []string, maxLoRAs int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	slots := max(a.maxLoRAs, 1)
	return slices.Clone(a.served), slices.Clone(a.recent[max(0, len(a.recent)-slots):]), a.maxLoRAs
}

// adapters reads the engine's GET /v1/models: the names of the cards whose
// parent is model.
func (e *engineClient) adapters(ctx context.Context, model string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.cfg.engineURL("/v1/models"), nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("engine %s: models: %w", e.cfg.EngineURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("engine %s: models: status %d", e.cfg.EngineURL, resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBytes)).Decode(&list); err != nil {
		return nil, fmt.Errorf("engine %s: models: %w", e.cfg.EngineURL, err)
	}
	var out []string
	for _, m := range list.Data {
		if m.Parent != nil && *m.Parent == model && m.ID != model {
			out = append(out, m.ID)
		}
	}
	return workers.SortAdapters(out), nil
}

// refreshServed re-reads the served adapters; on a failure it keeps the
// last list (an engine that has no /v1/models serves no adapter the bridge
// can name).
func (b *Bridge) refreshServed(ctx context.Context) {
	served, err := b.eng.adapters(ctx, b.cfg.Model)
	if err != nil {
		b.log.Debug("adapters not read", "err", err)
		return
	}
	b.adapters.setServed(served)
}

// syncAdapters writes the adapter lists to the registry when they changed.
func (b *Bridge) syncAdapters(ctx context.Context) {
	b.mu.Lock()
	reg := b.reg
	b.mu.Unlock()
	if reg == nil {
		return
	}
	served, loaded, maxLoRAs := b.adapters.lists()
	if err := reg.SetAdapters(ctx, served, loaded, maxLoRAs); err != nil && ctx.Err() == nil {
		b.log.Debug("adapters not written (the heartbeat retries)", "err", err)
	}
}
