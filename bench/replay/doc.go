// Package replay drives a workload through a routing stack once per policy,
// each time on a fresh fleet, and collects what every request saw.
//
// A Stack is one fleet plus its router replicas behind the route API; the
// driver only talks to it through three small interfaces, as a client would:
// Router (route, prefill_done, free: api.Client over NATS), Generator (send
// the request to the chosen worker's endpoint and stream the answer:
// sim.Generate over NATS) and, for the true-cache policy only, CacheProbe
// (the simulated workers' exact cache contents). NewNATSStack builds the real one: an
// embedded NATS server, simulated workers (workers/sim) publishing KV events,
// and router replicas (router/host) in one process; tests use fakes.
//
// Policies compared (Catalog): kvrouter's default policy fed by events,
// kvrouter in the host's approximate mode (no events: the routers index
// their routing decisions, shared between replicas), round-robin, random,
// least-loaded, the peers' algorithms (PeerPolicies: llmd, sglang, dynamo,
// chwbl; router/scheduler/peers.go) on the same index and load view, each
// with its own admission and session affinity (scheduler.Registry.Operation,
// applied by Config.stackConfig) instead of kvrouter's queue threshold and
// the run's binding mode, and true-cache (truecache.go): the
// default cost fed with the engines' true caches on the client, its choice
// sent as a Soft preference through the same route API; it shows what the
// index's lag costs the default and is no bound (the bound is the
// workload's infinite-cache ratio, reported with every run).
//
// What routers may know (prepare.go): the prompt and the client's
// max_tokens (Config.MaxTokens, the workload's cap by default), never a
// request's output length, which only the engine is told.
//
// Prefill/decode split fleets (pd.go): with Config.Fleet, the PD policies
// (kvrouter-pd; round-robin-pd, without a router queue as the simple
// proxies it stands for run; round-robin-pd-queued) run on prefill and
// decode workers, each request asking for a pair and running its two legs
// as the gateway does;
// the others run on an aggregated fleet of the same size. Summaries then
// carry the hit ratio per side, the transfer and the prefill leg
// (metrics.PDSummary).
//
// Held-out protocol (heldout.go): Config.Part names the part of the
// workload replayed; TunedOn records what each catalog entry was tuned on;
// Run refuses an evaluation part a policy was tuned on (ErrInSample) unless
// AllowInSample, which marks its rows IN-SAMPLE. Calibrate (calibrate.go)
// searches the load levels.
//
// Paths (Config.Paths, PathConfig): PathNATS is the flow below; on
// PathGateway a FrontendStack's Frontend sends each request as one OpenAI
// streaming completion through the gateway (frontend.go), and latencies
// are the client's wall clock times the speed-up. Every path replays the
// same requests at the same arrival times with the same seed; Config.Runs
// repeats the whole comparison and reports medians with their spread
// (runs.go).
//
// Client flow per request: wait for its arrival (workload time divided by
// the speed-up) → route → generate on the chosen worker → prefill_done at the
// first token → free at the end. Latencies are in workload time: the
// engine's own TTFT/ITL/E2E (model time) plus the time the request waited in
// the router's queue (reported by the router), multiplied by the speed-up.
// Transport and the replay's own CPU time are not counted (a speed-up would
// multiply them); the routing decision's wall-clock latency is reported
// separately.
//
// Start at Run.
package replay
