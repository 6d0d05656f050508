package host

import (
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
)

// A route request naming a LoRA adapter (lora_name) hashes its prompt with
// the adapter in the seed (promptHashes, as the engines' events are hashed)
// and tells the scheduler which workers hold the adapter on their GPU, as
// the worker registry says (workers.Info.LoadedAdapters): the default cost
// charges the others the adapter's load (scheduler/adapters.go). Which
// workers serve the adapter at all is the caller's to restrict
// (allowed_workers: the gateway does); a worker that serves an adapter it
// has not loaded is still a candidate.

// adapterRequirement sets sr's adapter and the workers holding it (into
// the scratch's reused slice).
func (ms *modelState) adapterRequirement(req *api.RouteRequest, sr *scheduler.Request, s *routeScratch) {
	if req.LoraName == "" {
		return
	}
	s.holders = s.holders[:0]
	for id, w := range *ms.workers.Load() {
		if w.AdapterLoaded(req.LoraName) {
			s.holders = append(s.holders, id)
		}
	}
	sr.Adapter, sr.AdapterResident = req.LoraName, s.holders
}
