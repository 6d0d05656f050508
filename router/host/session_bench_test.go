package host

import (
	"strconv"
	"testing"

	"github.com/kvrouter/kvrouter/router/api"
)

// BenchmarkRouteInProcessSession is BenchmarkRouteInProcess with a session
// per request (64 sessions, each bound by its first request): the binding
// read and commit, and the route deadline's context, included.
func BenchmarkRouteInProcessSession(b *testing.B) {
	benchRouteInProcess(b, 8, func(i int, req *api.RouteRequest) { req.SessionID = "bench-" + strconv.Itoa(i) })
}
