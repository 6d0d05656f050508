package replay

import (
	"fmt"
	"strings"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// trueCacheName is the catalog name of the true-cache policy.
const trueCacheName = "true-cache"

// UnloadedTTFT is the time to first token each request would see alone on an
// idle worker with a cold cache, from the simulator's timing model (chunked
// prefill at maxBatched tokens per step): the reference against which
// "loaded" is judged.
func UnloadedTTFT(w *workload.Workload, blockSize, maxBatched int) metrics.Dist {
	if maxBatched <= 0 {
		maxBatched = sim.DefaultMaxBatchedTokens
	}
	tm := sim.DefaultTiming()
	recs := make([]metrics.Record, len(w.Requests))
	for i := range w.Requests {
		left := w.Requests[i].InputLength
		var ms float64
		for left > 0 {
			chunk := min(left, maxBatched)
			ms += tm.PrefillMs(chunk)
			left -= chunk
		}
		recs[i] = metrics.Record{TTFT: msDur(ms), E2E: msDur(ms)}
	}
	return metrics.Summarize(recs, metrics.Options{}).TTFT
}

// The two load levels of a comparison (docs/benchmarks/replay.md, "Load
// levels"): round-robin's TTFT p99 at about 3x its unloaded value (within
// LoadModerateLow..LoadModerateHigh), or at least LoadHigh times it.
const (
	LoadModerate     = 3.0
	LoadModerateLow  = 2.5
	LoadModerateHigh = 4.0
	LoadHigh         = 10.0
)

// Checks evaluates the targets that this run can show: kvrouter
// against round-robin, the peers and true-cache, and whether the load sat at
// one of the two load levels the latency targets are judged at.
func Checks(r *report.Report) []report.Check {
	var out []report.Check
	kv, rr, tc := r.Policy("kvrouter"), r.Policy("round-robin"), r.Policy(trueCacheName)
	if rr != nil && r.Unloaded != nil && r.Unloaded.P99 > 0 {
		x := rr.TTFT.P99 / r.Unloaded.P99
		level := "between the levels"
		switch {
		case x >= LoadHigh:
			level = "high"
		case x >= LoadModerateLow && x <= LoadModerateHigh:
			level = "moderate"
		}
		out = append(out, report.Check{Name: "load level: round-robin p99 TTFT vs unloaded p99",
			Want: fmt.Sprintf("≈ %gx (%g-%gx) or ≥ %gx", LoadModerate, LoadModerateLow, LoadModerateHigh, LoadHigh),
			Got:  fmt.Sprintf("%.1fx, %s (%.0f / %.0f ms)", x, level, rr.TTFT.P99, r.Unloaded.P99), Pass: level != "between the levels"})
	}
	if kv != nil && rr != nil && kv.TTFT.P99 > 0 && kv.TTFT.P50 > 0 {
		x99, x50 := rr.TTFT.P99/kv.TTFT.P99, rr.TTFT.P50/kv.TTFT.P50
		out = append(out,
			report.Check{Name: "kvrouter p99 TTFT lower than round-robin's", Want: "≥ 5x", Got: fmt.Sprintf("%.1fx (%.0f vs %.0f ms)", x99, kv.TTFT.P99, rr.TTFT.P99), Pass: x99 >= 5},
			report.Check{Name: "kvrouter p50 TTFT lower than round-robin's", Want: "≥ 2x", Got: fmt.Sprintf("%.1fx (%.0f vs %.0f ms)", x50, kv.TTFT.P50, rr.TTFT.P50), Pass: x50 >= 2},
		)
	}
	if kv != nil && tc != nil && tc.HitRatio > 0 {
		x := kv.HitRatio / tc.HitRatio
		out = append(out, report.Check{Name: "kvrouter hit ratio vs true-cache's", Want: "≥ 95 %", Got: fmt.Sprintf("%.1f %% (%.1f %% vs %.1f %%)", 100*x, 100*kv.HitRatio, 100*tc.HitRatio), Pass: x >= 0.95})
	}
	out = append(out, pdChecks(r)...)
	out = append(out, peerChecks(r, kv)...)
	if kv != nil && r.Setup.SessionMode == string(SessionHard) {
		out = append(out, report.Check{Name: "Hard sessions never move while their worker is alive", Want: "0 moved", Got: fmt.Sprintf("%d of %d", kv.SessionsMoved, kv.Sessions), Pass: kv.SessionsMoved == 0})
	}
	return out
}

// Issue 28's targets for a split fleet (pd.go): the aggregated fleet's
// TTFT p99 at least PDLoad times its unloaded value, and KV-aware split
// routing's TTFT p99 at least PDGain times lower than round-robin
// pairing's.
const (
	PDLoad = 5.0
	PDGain = 1.5
)

// pdChecks are issue 28's targets, when the split policies ran. The load
// level is checked for each aggregated policy that ran: kvrouter's, and
// round-robin's, which defines the load levels everywhere else
// (docs/benchmarks/replay.md, "Load levels").
func pdChecks(r *report.Report) []report.Check {
	kv, rr := r.Policy("kvrouter-pd"), r.Policy("round-robin-pd")
	var out []report.Check
	for _, name := range []string{"kvrouter", "round-robin"} {
		agg := r.Policy(name)
		if agg == nil || (kv == nil && rr == nil) || r.Unloaded == nil || r.Unloaded.P99 <= 0 {
			continue
		}
		x := agg.TTFT.P99 / r.Unloaded.P99
		out = append(out, report.Check{Name: "load level: aggregated " + name + " p99 TTFT vs unloaded p99", Want: fmt.Sprintf("≥ %gx", PDLoad),
			Got: fmt.Sprintf("%.1fx (%.0f / %.0f ms)", x, agg.TTFT.P99, r.Unloaded.P99), Pass: x >= PDLoad})
	}
	if kv != nil && rr != nil && kv.TTFT.P99 > 0 {
		x := rr.TTFT.P99 / kv.TTFT.P99
		out = append(out, report.Check{Name: "kvrouter-pd p99 TTFT lower than round-robin pairing's", Want: fmt.Sprintf("≥ %gx", PDGain),
			Got: fmt.Sprintf("%.2fx (%.0f vs %.0f ms)", x, kv.TTFT.P99, rr.TTFT.P99), Pass: x >= PDGain})
	}
	return out
}

// peerChecks are issue 17's targets against the peers' algorithms, on
// kvrouter's first path: the lowest TTFT p50 and p99 of every deployable
// policy on an aggregated fleet (true-cache reads the engines on the
// client: no router can; split fleets are pdChecks'), and
// a p99 at least 1.2x lower than the best peer's.
func peerChecks(r *report.Report, kv *metrics.Summary) []report.Check {
	if kv == nil {
		return nil
	}
	peer := map[string]bool{}
	for _, n := range PeerPolicies {
		peer[n] = true
	}
	var best *metrics.Summary
	lowest50, lowest99 := true, true
	var beat50, beat99 []string
	compared := 0
	for i := range r.Policies {
		p := &r.Policies[i]
		if p.Path != kv.Path || p.Policy == kv.Policy || p.Policy == trueCacheName || p.Done == 0 || p.PD != nil {
			continue
		}
		compared++
		if p.TTFT.P50 < kv.TTFT.P50 {
			lowest50 = false
			beat50 = append(beat50, p.Policy)
		}
		if p.TTFT.P99 < kv.TTFT.P99 {
			lowest99 = false
			beat99 = append(beat99, p.Policy)
		}
		if peer[p.Policy] && (best == nil || p.TTFT.P99 < best.TTFT.P99) {
			best = p
		}
	}
	if compared == 0 {
		return nil // nothing to be lowest among (a split-fleet run: pdChecks)
	}
	lower := func(names []string) string {
		if len(names) == 0 {
			return "lowest"
		}
		return "beaten by " + strings.Join(names, ", ")
	}
	out := []report.Check{
		{Name: "kvrouter lowest TTFT p50 of the deployable policies", Want: "lowest", Got: fmt.Sprintf("%s (%.0f ms)", lower(beat50), kv.TTFT.P50), Pass: lowest50},
		{Name: "kvrouter lowest TTFT p99 of the deployable policies", Want: "lowest", Got: fmt.Sprintf("%s (%.0f ms)", lower(beat99), kv.TTFT.P99), Pass: lowest99},
	}
	if best != nil && kv.TTFT.P99 > 0 {
		x := best.TTFT.P99 / kv.TTFT.P99
		out = append(out, report.Check{Name: "kvrouter p99 TTFT lower than the best peer's", Want: "≥ 1.2x",
			Got: fmt.Sprintf("%.2fx (%.0f vs %s %.0f ms)", x, kv.TTFT.P99, best.Policy, best.TTFT.P99), Pass: x >= 1.2})
	}
	return out
}

// PolicyNames joins the names of policies.
func PolicyNames(ps []Policy) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}
