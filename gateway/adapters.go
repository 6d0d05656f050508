package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
)

// This file is what the gateway does with the two request fields that
// change an engine's block hashes besides the prompt
// (../shared/reference/protocols-engines-gateways.md, sections 2 and 3):
//
//   - a LoRA adapter named as "model": the gateway serves it when a ready
//     worker of one of its models lists it in the registry (the bridge
//     registers what the engine's /v1/models says). The request routes as
//     its base model's, among the workers that serve the adapter
//     (allowed_workers), with lora_name set, so the router hashes its prompt
//     with the adapter in the seed as the engines' events are hashed and
//     prefers a worker that has it loaded; the engine gets the body
//     unchanged, the adapter's name in "model". /tokenize is asked of a
//     worker serving the adapter, with the adapter's name.
//   - cache_salt: checked as vLLM checks it (a non-empty string), at most
//     MaxCacheSaltBytes, and set as the route request's cache_salt: a
//     salted request matches only blocks stored under its salt.

// MaxCacheSaltBytes bounds a request's cache_salt: the route API's limit
// (1,024 bytes), which one vLLM version also puts on it (as characters).
const MaxCacheSaltBytes = 1024

// modelTarget is what a request's model and salt route as.
type modelTarget struct {
	base    string   // the configured model the request routes under
	adapter string   // the LoRA adapter the request names ("" = the base model)
	workers []string // with an adapter: the workers serving it
	salt    string   // cache_salt ("" = none)
}

// apply sets rq's routing fields of t.
func (t *modelTarget) apply(rq *api.RouteRequest) {
	rq.Model, rq.LoraName, rq.CacheSalt = t.base, t.adapter, t.salt
	if t.adapter != "" {
		rq.AllowedWorkers = t.workers
	}
}

// modelTarget resolves the request's model (a configured model, else an
// adapter some ready worker of one serves) and checks its cache_salt.
func (g *Gateway) modelTarget(ctx context.Context, cr *clientRequest) (modelTarget, *RequestError) {
	t := modelTarget{base: cr.Model}
	if g.models[cr.Model] == nil {
		base, es := g.adapterEngines(ctx, cr.Model)
		switch {
		case base == "" && g.knownAdapter(cr.Model):
			return t, serverError(http.StatusServiceUnavailable, api.CodeNoEligibleWorker,
				"no worker can take the request: the workers serving the LoRA adapter %q are not ready", cr.Model)
		case base == "":
			return t, notFound("model_not_found", "the model %q does not exist (served: %v and the LoRA adapters their workers list)", cr.Model, g.cfg.Models)
		}
		t.base, t.adapter = base, cr.Model
		for _, e := range es {
			t.workers = append(t.workers, e.worker)
		}
	}
	salt, e := cacheSalt(cr.CacheSalt)
	t.salt = salt
	return t, e
}

// cacheSalt reads cache_salt: absent or null is none; otherwise a
// non-empty string of at most MaxCacheSaltBytes.
func cacheSalt(raw json.RawMessage) (string, *RequestError) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if bytes.TrimSpace(raw)[0] != '"' || json.Unmarshal(raw, &s) != nil || s == "" {
		return "", badRequest("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
	}
	if len(s) > MaxCacheSaltBytes {
		return "", badRequest("cache_salt", "cache_salt is %d bytes long, the limit is %d", len(s), MaxCacheSaltBytes)
	}
	return s, nil
}

// adapterEngines returns the configured model one of whose ready workers
// serves adapter name, and those workers ("" and none when no worker of
// any model lists it). The first model with such a worker wins.
func (g *Gateway) adapterEngines(ctx context.Context, name string) (string, []engine) {
	for _, m := range g.cfg.Models {
		var es []engine
		for _, e := range g.liveWorkers(ctx, m) {
			if slices.Contains(e.adapters, name) {
				es = append(es, e)
			}
		}
		if len(es) > 0 {
			return m, es
		}
	}
	return "", nil
}

// knownAdapter reports whether a worker of a configured model in any
// state (draining, unavailable) lists adapter name: a request for it is
// then 503, as for a model whose workers are not ready, not 404.
func (g *Gateway) knownAdapter(name string) bool {
	for _, c := range g.models {
		c.mu.Lock()
		known := slices.Contains(c.adapters, name)
		c.mu.Unlock()
		if known {
			return true
		}
	}
	return false
}

// modelEngines is liveWorkers for a configured model, and for an adapter
// the workers serving it, with the cache of the model they belong to
// (nil when the name is neither).
func (g *Gateway) modelEngines(ctx context.Context, model string) ([]engine, *workerCache) {
	if c := g.models[model]; c != nil {
		return g.liveWorkers(ctx, model), c
	}
	base, es := g.adapterEngines(ctx, model)
	return es, g.models[base]
}

// retryAllowed is the allowed set of a retry: the live workers other than
// the failed one, within the first attempt's allowed set when it had one
// (an adapter's serving workers).
func (g *Gateway) retryAllowed(ctx context.Context, rq *api.RouteRequest, failed string) []string {
	out := g.others(ctx, rq.Model, failed)
	if len(rq.AllowedWorkers) > 0 {
		out = slices.DeleteFunc(out, func(w string) bool { return !slices.Contains(rq.AllowedWorkers, w) })
	}
	return out
}

// adapterCards are the /v1/models entries of the adapters the ready
// workers of the configured models serve, each with its parent.
func (g *Gateway) adapterCards(ctx context.Context) []modelCard {
	var out []modelCard
	seen := map[string]bool{}
	for _, m := range g.cfg.Models {
		for _, e := range g.liveWorkers(ctx, m) {
			for _, a := range e.adapters {
				if !seen[a] && g.models[a] == nil {
					seen[a] = true
					out = append(out, modelCard{ID: a, Object: "model", OwnedBy: "kvrouter", Parent: m})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b modelCard) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// namespaceBlocks keeps the approx scheme's pseudo-blocks of an adapter or
// a salt apart from the base model's: each hash is chained onto the
// request's seed, as the engine's blocks are hashed with it (the approx
// replica's index is fed by routing decisions, so the keys only need to
// differ per adapter and salt).
func namespaceBlocks(rq *api.RouteRequest) {
	if len(rq.BlockHashes) == 0 || (rq.LoraName == "" && rq.CacheSalt == "") {
		return
	}
	seed := kvevents.SeqHash(kvevents.SeedFor(rq.LoraName, rq.CacheSalt))
	for i, h := range rq.BlockHashes {
		rq.BlockHashes[i] = uint64(kvevents.NextSeqHash(seed, h))
	}
}
