package micro

import (
	"fmt"
	"regexp"
	"strings"
)

// Target is one performance goal from an issue, matched against benchmarks by
// package suffix and a regular expression on the benchmark name.
type Target struct {
	Issue   int
	Goal    string // the issue's words, shortened
	Package string // import path suffix, e.g. "router/index"
	Bench   string // regexp on the benchmark name (no "Benchmark" prefix, no -N)
	Unit    string // unit of the figure compared
	Max     float64
	Min     float64 // used when Max is 0
}

func (t Target) re() *regexp.Regexp { return regexp.MustCompile(t.Bench) }

// Want is the target as text, e.g. "≤ 5000 ns/op".
func (t Target) Want() string {
	if t.Max == 0 && t.Min == 0 {
		return "0 " + t.Unit
	}
	if t.Max > 0 {
		return "≤ " + Format(t.Max, t.Unit)
	}
	return "≥ " + Format(t.Min, t.Unit)
}

// Met reports whether v satisfies the target.
func (t Target) Met(v float64) bool {
	if t.Max > 0 || t.Min == 0 {
		return v <= t.Max
	}
	return v >= t.Min
}

// Matches reports whether the benchmark is measured by this target.
func (t Target) Matches(b *Bench) bool {
	return strings.HasSuffix(b.Package, t.Package) && t.re().MatchString(b.Name)
}

// Targets is the table of goals from the issues. Benchmark names follow the
// packages' own benchmarks; a target no benchmark matches is listed as "not
// measured" in the report, so a rename shows up instead of passing silently.
var Targets = []Target{
	// Issue 2: kvevents.
	{Issue: 2, Goal: "decode one vLLM BlockStored (16 blocks x 16 tokens) with hashing", Package: "kvevents/vllm", Bench: `^VLLMStored16x16/`, Unit: "ns/op", Max: 3000},
	{Issue: 2, Goal: "decode one vLLM BlockStored: allocations", Package: "kvevents/vllm", Bench: `^VLLMStored16x16/`, Unit: "allocs/op", Max: 2},
	{Issue: 2, Goal: "publisher to subscriber through the embedded server, batched", Package: "kvevents", Bench: `^PublishSubscribe/.*max_batch=default`, Unit: "blocks/s", Min: 200000},

	// Issue 3: router/index.
	{Issue: 3, Goal: "apply stored blocks at 1,000 workers, one core", Package: "router/index", Bench: `^Apply/`, Unit: "stored-blocks/s", Min: 5e6},
	{Issue: 3, Goal: "lookup 128-block prompt, 1M blocks over 1,000 workers", Package: "router/index", Bench: `^Lookup/`, Unit: "ns/op", Max: 5000},
	{Issue: 3, Goal: "lookup: per matched block", Package: "router/index", Bench: `^Lookup/`, Unit: "ns/matched-block", Max: 30},
	{Issue: 3, Goal: "lookup: no allocation", Package: "router/index", Bench: `^Lookup/`, Unit: "allocs/op", Max: 0},

	// Issue 5: router/scheduler, a quarter of the Rust medians of the design note.
	{Issue: 5, Goal: "default selection, 2 workers, T=0", Package: "router/scheduler", Bench: `^DefaultSelection/T=0/workers=2$`, Unit: "ns/op", Max: 78.56 / 4},
	{Issue: 5, Goal: "default selection, 32 workers, T=0", Package: "router/scheduler", Bench: `^DefaultSelection/T=0/workers=32$`, Unit: "ns/op", Max: 632.53 / 4},
	{Issue: 5, Goal: "default selection, 2,048 workers, T=0", Package: "router/scheduler", Bench: `^DefaultSelection/T=0/workers=2048$`, Unit: "ns/op", Max: 42374 / 4},
	{Issue: 5, Goal: "default selection, 10,000 workers, T=0", Package: "router/scheduler", Bench: `^DefaultSelection/T=0/workers=10000$`, Unit: "ns/op", Max: 270990 / 4},
	{Issue: 5, Goal: "default selection, 2 workers, T=0.7", Package: "router/scheduler", Bench: `^DefaultSelection/T=0.7/workers=2$`, Unit: "ns/op", Max: 105.61 / 4},
	{Issue: 5, Goal: "default selection, 2,048 workers, T=0.7", Package: "router/scheduler", Bench: `^DefaultSelection/T=0.7/workers=2048$`, Unit: "ns/op", Max: 51961 / 4},
	{Issue: 5, Goal: "custom policy, 10,000 workers, no filter", Package: "router/scheduler", Bench: `^CustomSelection/no_filter/workers=10000$`, Unit: "ns/op", Max: 217830 / 4},
	{Issue: 5, Goal: "custom policy, 10,000 workers, keep-all filter", Package: "router/scheduler", Bench: `^CustomSelection/keep_all_filter/workers=10000$`, Unit: "ns/op", Max: 353030 / 4},
	{Issue: 5, Goal: "selection allocates nothing", Package: "router/scheduler", Bench: `^(DefaultSelection|CustomSelection|SelectionUnderHard)`, Unit: "allocs/op", Max: 0},

	// Issue 6: bindings.
	{Issue: 6, Goal: "commit on a single embedded server, p50", Package: "bindings", Bench: `^CommitSingle`, Unit: "p50-µs", Max: 60},
	{Issue: 6, Goal: "commit on a 3-node cluster, p50", Package: "bindings", Bench: `^CommitCluster`, Unit: "p50-µs", Max: 250},

	// Issue 7: the replica's NATS route API.
	{Issue: 7, Goal: "route over NATS, one replica, 2,048-token requests", Package: "router/host", Bench: `(?i)route.*nats|nats.*route`, Unit: "routes/s", Min: 20000},
	{Issue: 7, Goal: "route over NATS, p50 client to client", Package: "router/host", Bench: `(?i)route.*nats|nats.*route`, Unit: "p50-µs", Max: 150},
	{Issue: 12, Goal: "one simulated engine, streamed completions per second of wall clock (16 output tokens)", Package: "workers/sim/vllmapi", Bench: `^StreamedCompletions`, Unit: "completions/s", Min: 2000},
	{Issue: 13, Goal: "bridge relays ZMQ -> JetStream, 16 blocks per event", Package: "workers/bridge", Bench: `^Relay`, Unit: "blocks/s", Min: 200000},
	{Issue: 13, Goal: "engine publish -> router index applied at 10,000 events/s, p50", Package: "workers/bridge", Bench: `^EndToEndLatency`, Unit: "p50-ms", Max: 2},
	{Issue: 13, Goal: "engine publish -> router index applied at 10,000 events/s, p99", Package: "workers/bridge", Bench: `^EndToEndLatency`, Unit: "p99-ms", Max: 10},
	{Issue: 13, Goal: "idle CPU of a bridge", Package: "workers/bridge", Bench: `^IdleCPU`, Unit: "%core", Max: 1},
	{Issue: 14, Goal: "non-streaming requests per second through one gateway", Package: "gateway", Bench: `^Throughput`, Unit: "req/s", Min: 3000},

	// Issue 29: overhead near the machine's limit. Where a figure is a
	// difference from a baseline in the same run (the gateway's TTFT
	// overhead), the benchmark reports the difference itself.
	{Issue: 29, Goal: "route in process, 32 workers, 2,048-token prompts", Package: "router/host", Bench: `^RouteInProcess$`, Unit: "p50-µs", Max: 15},
	{Issue: 29, Goal: "routes per second per replica over NATS, client on the same cores", Package: "router/host", Bench: `^RouteNATS/.*/replicas=1/throughput$`, Unit: "routes/s", Min: 30000},
	{Issue: 29, Goal: "gateway TTFT overhead against the engine called directly, p50", Package: "gateway", Bench: `^TTFT$`, Unit: "overhead-p50-µs", Max: 300},
	{Issue: 29, Goal: "gateway TTFT overhead against the engine called directly, p99", Package: "gateway", Bench: `^TTFT$`, Unit: "overhead-p99-µs", Max: 1500},
	{Issue: 29, Goal: "non-streaming requests per second through one gateway", Package: "gateway", Bench: `^Throughput`, Unit: "req/s", Min: 5000},
	{Issue: 29, Goal: "gateway CPU per relayed token", Package: "gateway", Bench: `^StreamRelay/chunks=1000$`, Unit: "cpu-ns/token", Max: 1000},
	{Issue: 29, Goal: "Hard session route over NATS, one server, p50", Package: "router/host", Bench: `^RouteNATSSession/single/hard$`, Unit: "p50-µs", Max: 300},
	{Issue: 29, Goal: "Hard session route over NATS, 3-node cluster, p50", Package: "router/host", Bench: `^RouteNATSSession/cluster/hard$`, Unit: "p50-µs", Max: 500},
	{Issue: 29, Goal: "apply stored blocks at 1M entries", Package: "router/index", Bench: `^Apply/entries=1M/`, Unit: "stored-blocks/s", Min: 5e6},
	{Issue: 29, Goal: "lookup of a 128-block prompt, 1,000 holders per block", Package: "router/index", Bench: `^Lookup/shared1000$`, Unit: "ns/op", Max: 5000},
}

// Format prints a figure with its unit, scaling ns to µs or ms when large.
func Format(v float64, unit string) string {
	switch unit {
	case "ns/op", "ns/block":
		per := strings.TrimPrefix(unit, "ns")
		switch {
		case v >= 1e6:
			return trim(fmt.Sprintf("%.2f", v/1e6)) + " ms" + per
		case v >= 1e3:
			return trim(fmt.Sprintf("%.2f", v/1e3)) + " µs" + per
		}
		return trim(fmt.Sprintf("%.2f", v)) + " ns" + per
	}
	switch {
	case v >= 1e6:
		return trim(fmt.Sprintf("%.2f", v/1e6)) + "M " + unit
	case v >= 1e4:
		return trim(fmt.Sprintf("%.1f", v/1e3)) + "k " + unit
	case v == float64(int64(v)):
		return fmt.Sprintf("%d %s", int64(v), unit)
	}
	return trim(fmt.Sprintf("%.2f", v)) + " " + unit
}

func trim(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
