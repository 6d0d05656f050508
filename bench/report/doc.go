// Package report renders a replay's results: a fixed-width table for the
// terminal, a Markdown report, a JSON file (the source of truth; the other
// outputs can be regenerated from it) and PNG charts drawn with gonum/plot:
// the TTFT CDF per policy, the hit ratio per policy against the workload's
// upper bound, and the per-worker load under each policy.
//
// Start at Report and WriteAll. It knows nothing about how the numbers were
// measured (see bench/replay).
package report
