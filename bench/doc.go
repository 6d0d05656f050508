// Package bench is kvrouter's replay harness: it drives workloads through the
// real stack (embedded NATS, simulated workers, router replicas, the NATS route
// API) and reports how each routing policy did, side by side.
//
// It owns:
//   - workload: the request type, the Mooncake trace reader, synthetic
//     generators, the held-out parts and the infinite-cache upper bound
//     (bench/workload);
//   - metrics: per-request records aggregated into per-policy summaries
//     (bench/metrics);
//   - report: terminal table, Markdown, JSON and PNG charts (bench/report);
//   - replay: the driver, its Router, Generator and CacheProbe interfaces,
//     the policy catalog with what each entry was tuned on, the held-out
//     rule, the load-level search and the client-side true-cache policy
//     (bench/replay);
//   - stack: the real stack a replay runs against, in one process: embedded
//     NATS, simulated workers, router replicas, an exact cache mirror for
//     the true-cache policy (bench/stack);
//   - progress: the stderr progress bar (bench/progress);
//   - micro: running every Go microbenchmark and writing docs/benchmarks.md
//     next to the targets of the issues (bench/micro).
//
// It does not own the router, the scheduler, the index, the simulated engine
// or the NATS APIs: it only calls them, as a client would.
//
// Start reading at replay.Run (one comparison run), stack.New and
// workload.Request. The CLI is cmd/kvrouter/bench.go (kvrouter bench replay,
// kvrouter bench micro).
package bench
