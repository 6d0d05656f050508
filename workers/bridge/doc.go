// Package bridge turns one vLLM or SGLang engine into a kvrouter worker: the
// sidecar behind `kvrouter bridge`. Routers do not change; they see a worker
// like any other.
//
// It owns, for one engine:
//
//   - events (follow.go): one ZMQ SUB per data-parallel rank
//     (kvevents/vllmzmq), each payload decoded with vllm.DecodeBatch
//     (salvage.go splits a batch that did not decode into single events
//     with internal/msgpack's Reader and decodes those one by one),
//     converted with a vllm.Converter and published with a
//     kvevents.Publisher, both sequence-keyed unless Config.EngineKeyed
//     (Config.rankEvents keeps them alike). Sequence tracking: replay from the engine's replay
//     socket at start and on every gap; a resync (KindCleared, then what the
//     engine still reports) when the replay is late, absent or fails, and
//     at each dropped event that may have removed blocks (one that does not
//     decode and is not a BlockStored, or of an unknown type); a seq that
//     goes down is an engine restart (KindCleared, new converter).
//   - registration and eligibility (bridge.go): the worker registered in the
//     registry with the engine's base URL as its endpoint, its ranks, block
//     size and capacity, once the engine answers; state ready while /health
//     answers and the last /metrics scrape is fresh, unavailable otherwise;
//     deregistered on drain.
//   - load (engine.go): /metrics scraped every interval (vLLM's or SGLang's
//     names) and published as workers.LoadReport per rank.
//   - LoRA adapters (adapters.go): the adapters the engine serves (its
//     /v1/models) and the ones it holds on its GPU (the adapters its events
//     and vllm:lora_requests_info show in use, up to max_lora), written to
//     the registry entry when they change.
//   - its own /healthz, /readyz and /metrics (metrics.go).
//
// It does not own the vLLM decoder or converter (kvevents/vllm), the ZMQ
// transport (kvevents/vllmzmq), the registry or load subjects (workers), or
// the command line (cmd/kvrouter bridge.go).
//
// Start reading at Bridge.Run in bridge.go, then rank.run in follow.go.
// docs/bridge.md is the bridge's part of the protocol and the walk-through
// for running it next to vLLM and SGLang.
package bridge
