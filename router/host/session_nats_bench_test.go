package host

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/router/api"
)

// BenchmarkRouteNATSSession is the latency of one client routing requests
// of existing sessions through the NATS API (embedded server, 8 workers,
// one replica): a Hard session's binding is read from the bindings
// stream's leader on every request, a Soft one from the replica's cache
// while it is shown fresh. 64 sessions, created during warm-up, so every
// measured request finds its binding (outcome fresh).
func BenchmarkRouteNATSSession(b *testing.B) {
	for _, mode := range []string{"hard", "soft"} {
		b.Run(mode, func(b *testing.B) {
			st, prefixes := benchStack(b, 8, 1)
			bodies := benchRequests(prefixes, 512, true)
			for i := range bodies {
				var req api.RouteRequest
				if err := api.DecodeRouteRequest(bodies[i], &req); err != nil {
					b.Fatal(err)
				}
				req.SessionID, req.SessionMode = fmt.Sprintf("bench-%s-%d", mode, i%64), mode
				bodies[i] = api.AppendRouteRequest(nil, &req)
			}
			subject := api.RouteSubject("", testModel)
			nc := natstest.Connect(b, st.srv)
			var resp api.RouteResponse
			var lc []byte
			for i := 0; i < 200; i++ { // warm up: create the 64 bindings
				routeOnce(b, nc, subject, bodies[i%len(bodies)], &resp, lc)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				lat = append(lat, routeOnce(b, nc, subject, bodies[i%len(bodies)], &resp, lc))
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
			b.ReportMetric(q(0.5), "p50-µs")
			b.ReportMetric(q(0.99), "p99-µs")
		})
	}
}
