// Package workload describes what a replay sends: a list of requests with
// arrival times, sessions and prompts, read from a Mooncake trace or made by a
// deterministic synthetic generator. It also computes a workload's
// infinite-cache upper bound on prefix reuse, the ceiling any router's hit
// ratio is compared with.
//
// Start with Request and Workload, then ReadMooncake (traces), the generators
// (Chat, SharedPrefix, FanOut, AgentLoop, RAG, TenantChat, Burst; Generate
// picks one by name), Workload.UpperBound, and part.go: the held-out split
// (Workload.TimePart for traces, GeneratePart by seed for generators).
//
// It owns no I/O besides reading a trace from a path or reader, and knows
// nothing about NATS, routers or workers.
package workload
