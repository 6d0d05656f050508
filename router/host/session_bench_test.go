package host

import (
	"context"
	"strconv"
	"testing"

	"github.com/kvrouter/kvrouter/router/api"
)

// BenchmarkRouteInProcessSession is BenchmarkRouteInProcess with a session
// per request (64 sessions, each bound by its first request): the binding
// read and commit, and the route deadline's context, included.
func BenchmarkRouteInProcessSession(b *testing.B) {
	st, prefixes := benchStack(b, 8, 1)
	r := st.replicas[0]
	ms := r.models[testModel]
	bodies := benchRequests(prefixes, 64, false)
	reqs := make([]api.RouteRequest, len(bodies))
	for i := range bodies {
		if err := api.DecodeRouteRequest(bodies[i], &reqs[i]); err != nil {
			b.Fatal(err)
		}
		reqs[i].SessionID = "bench-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := reqs[i%len(reqs)]
		req.RequestID = ""
		var resp api.RouteResponse
		if err := r.Route(ctx, &req, &resp); err != nil {
			b.Fatal(err)
		}
		fe, _ := ms.fences.get(resp.RequestID)
		_ = ms.sched.Free(fe)
		ms.fences.del(fe)
	}
}
