// Package report renders a replay's results: a fixed-width table for the
// terminal, a Markdown report, a JSON file (the source of truth; the other
// outputs can be regenerated from it) and PNG charts drawn with gonum/plot:
// the TTFT CDF per policy, the hit ratio per policy against the workload's
// upper bound, and the per-worker load under each policy.
//
// The Markdown report's "Why each policy wins or loses" section (why.go) is
// written from the figures alone, so it is true for whatever run produced
// them: per path, each policy is compared with the best policy over the same
// path (true-cache is quoted beside it, never counted as the best), and a
// line is written only when a figure crosses one of the named thresholds at
// the top of why.go: cache misses (hit ratio below the best, and whether the
// router's predicted hit agreed, which puts the loss on the choices rather
// than the index), cache thrash (sessions moved), hot spots (request and
// prefill spread, busiest worker over time), queueing (router queue wait as a
// share of TTFT, TTFT against the best) and rejections by code. The rules
// are the list in whyRules; add one there with its threshold constant.
//
// Every report states the held-out part it ran (Workload.Part, the Setup
// table) and the max_tokens its clients sent; rows of policies run on an
// evaluation part they were tuned on carry metrics.Summary.InSample and are
// labelled IN-SAMPLE wherever they are named.
//
// Start at Report and WriteAll. It knows nothing about how the numbers were
// measured (see bench/replay).
package report
