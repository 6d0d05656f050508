// Package bench is kvrouter's replay harness: it drives workloads through the
// real stack (embedded NATS, simulated workers, router replicas, the NATS route
// API) and reports how each routing policy did, side by side.
//
// It owns:
//   - workload: the request type, the Mooncake trace reader, synthetic
//     generators and the infinite-cache upper bound (bench/workload);
//   - metrics: per-request records aggregated into per-policy summaries
//     (bench/metrics);
//   - report: terminal table, Markdown, JSON and PNG charts (bench/report);
//   - replay: the driver, its Router and Fleet interfaces and the comparison
//     policies that are not the router's own (the oracle) (bench/replay);
//   - micro: running every Go microbenchmark and writing docs/benchmarks.md
//     next to the targets of the issues (bench/micro).
//
// It does not own the router, the scheduler, the index, the simulated engine
// or the NATS APIs: it only calls them, as a client would.
//
// Start reading at replay.Run (one comparison run) and workload.Request.
package bench
