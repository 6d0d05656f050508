// Package metrics turns per-request records of a replay into a per-policy
// Summary: completions and rejections, prefix-cache hit ratio against the
// workload's upper bound, latency percentiles (TTFT, ITL, end to end, routing
// decision), throughput, per-worker load spread and session moves.
//
// Recorder is safe for concurrent use by the replay's request goroutines;
// Summarize is pure. Latencies of the served requests are in the workload's
// (simulated) time; routing-decision latency is wall-clock time.
package metrics
