package stack

import (
	"context"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bench/workload"
)

// The same synthetic workload over both paths: every request is served
// through the gateway too, every row carries its path, true-cache is
// skipped on the gateway path with a note, and kvrouter's event-fed
// routing (ZMQ → bridge → JetStream) still finds the shared prefixes
// there, well above round-robin. At speed-up 1: the gateway path's
// latencies are the client's wall clock, and under -race on a shared
// machine a faster clock overloads it (503s at speed-up 5).
func TestReplayOverBothPaths(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two fleets per policy and path")
	}
	w := workload.SharedPrefix(workload.SharedPrefixConfig{Seed: 3, Groups: 16, PromptsPerGroup: 5, SystemTokens: 1024, QuestionTokens: 64, OutputTokens: 8, Rate: 10})
	pols, _ := replay.LookupPolicies([]string{"kvrouter,round-robin,true-cache"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := replay.Run(ctx, replay.Config{
		Workload: w, Policies: pols, Workers: 4, Speedup: 1, KVBlocks: 4096,
		Paths: []replay.PathConfig{
			{Name: replay.PathNATS, NewStack: Factory(Options{})},
			{Name: replay.PathGateway, NewStack: GatewayFactory(Options{}), NoTrueCache: true},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Policies) != 5 {
		t.Fatalf("%d rows, want 3 on nats + 2 on the gateway: %+v", len(rep.Policies), rep.Policies)
	}
	var kv, rr *float64
	for _, p := range rep.Policies {
		t.Logf("%-12s %-8s done %d/%d hit %.3f TTFT p50 %.0f p99 %.0f ms route p50 %.2f ms codes %v", p.Policy, p.Path, p.Done, p.Requests, p.HitRatio, p.TTFT.P50, p.TTFT.P99, p.Route.P50, p.Codes)
		if p.Path != replay.PathNATS && p.Path != replay.PathGateway {
			t.Errorf("%s: path %q", p.Policy, p.Path)
		}
		// Every group's first prompt is computed, not cached: the
		// replicas' estimate, read through either stack, fell below 1.
		if low := p.CachedShareLow; low == nil || *low < 0 || (p.Policy == "kvrouter" && *low >= 1) {
			t.Errorf("%s (%s): lowest cached-share estimate %v", p.Policy, p.Path, low)
		}
		if p.Path != replay.PathGateway {
			continue
		}
		if p.Policy == "true-cache" {
			t.Errorf("true-cache ran over the gateway")
		}
		if p.Done < p.Requests*9/10 {
			t.Errorf("%s over the gateway: %d of %d served (%v)", p.Policy, p.Done, p.Requests, p.Codes)
		}
		// The routing decision is the gateway's Server-Timing figure: there,
		// and far below the whole request's.
		if p.Route.N == 0 || p.Route.P50 <= 0 || p.Route.P50 >= p.E2E.P50 {
			t.Errorf("%s over the gateway: route %+v (E2E p50 %.1f ms)", p.Policy, p.Route, p.E2E.P50)
		}
		switch p.Policy {
		case "kvrouter":
			kv = &p.HitRatio
		case "round-robin":
			rr = &p.HitRatio
		}
	}
	if kv == nil || rr == nil {
		t.Fatal("missing gateway rows")
	}
	if *kv < *rr+0.15 {
		t.Errorf("over the gateway kvrouter hit %.3f not clearly above round-robin's %.3f", *kv, *rr)
	}
	checkFiles(t, rep)
}
