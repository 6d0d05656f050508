// Package stack builds the real routing stack a replay runs against, in one
// process: an embedded NATS server with JetStream (router/host's
// StartEmbedded, in-process connections), a fleet of simulated workers
// (workers/sim: step loops, KV events through kvevents publishers, registry
// heartbeats, load reports, the generate endpoint over NATS), and router
// replicas (router/host) in one queue group. The replay driver reaches it only
// as a client would: api.Client for the route API and sim.Generate for the
// workers' endpoints.
//
// For the true-cache policy it also mirrors each simulated worker's cache
// exactly: every event the engine emits is applied, synchronously and
// before it is published, to an in-memory copy (Mirror), so that policy
// reads the engines' true contents without event lag.
//
// The gateway path (GatewayFactory, gateway.go) runs Real (realpath.go)
// instead: simulated engines with vLLM's HTTP face and ZMQ KV events, one
// workers/bridge per engine, the replicas and the OpenAI gateway, reached
// by an OpenAI streaming client per request. `kvrouter demo` runs the same
// Real.
//
// Start at New (the NATS path) or StartReal (the real path).
package stack
