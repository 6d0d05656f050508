package epp

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkPick is the picker's added latency per request with 2,048-token
// prompts: from the last request body chunk sent to the destination
// received, as the proxy sees it over loopback gRPC (so it includes both
// gRPC hops on top of what kvr_epp_pick_duration_seconds measures: parse,
// the engine's render call on a simulated engine over loopback HTTP, and
// the route call to an in-process replica). Half the requests continue an
// earlier conversation (a cached prefix), half are new; the reply is
// faked, so only the picker and the router work. Reported as p50 and p99.
func BenchmarkPick(b *testing.B) {
	f := startFleet(b, 2, nil)
	ctx := context.Background()
	prefixes := make([]string, 32)
	for i := range prefixes {
		prefixes[i] = longText("conversation "+strconv.Itoa(i), 2000)
	}
	ds := make([]time.Duration, 0, b.N)
	i := 0
	for b.Loop() {
		i++
		p := prefixes[i%len(prefixes)]
		if i%2 == 1 {
			p = longText("fresh prompt "+strconv.Itoa(i), 2000)
		}
		q := chat(chatBody(true, 8, p, "question "+strconv.Itoa(i%7)), uint64(i))
		q.fakeReply, q.chunks = true, 3
		res, err := f.envoy(ctx, q)
		if err != nil || res.status != 200 {
			b.Fatalf("request %d: status %d, %v", i, res.status, err)
		}
		ds = append(ds, res.pick)
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), "p99-µs")
}
