package host

import (
	"fmt"
	"testing"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/router/api"
)

// BenchmarkRouteNATSSession is the latency of one client routing requests
// of existing sessions through the NATS API, end to end (8 workers, one
// replica): a Hard session's binding is read from the bindings stream's
// leader on every request, a Soft one from the replica's cache while it is
// shown fresh. 64 sessions, created during warm-up, so every measured
// request finds its binding (outcome fresh). single is one embedded
// server; cluster an in-process 3-node cluster with every stream and
// bucket (the bindings bucket too) on three replicas, the replica and the
// client on node 0 wherever the stream leaders are.
func BenchmarkRouteNATSSession(b *testing.B) {
	for _, setup := range []string{"single", "cluster"} {
		b.Run(setup, func(b *testing.B) {
			var c *natstest.Cluster
			if setup == "cluster" {
				c = natstest.StartCluster(b, 3)
			}
			for _, mode := range []string{"hard", "soft"} {
				b.Run(mode, func(b *testing.B) { benchRouteNATSSession(b, c, mode) })
			}
		})
	}
}

func benchRouteNATSSession(b *testing.B, c *natstest.Cluster, mode string) {
	st, prefixes := benchStackOn(b, 8, 1, c)
	bodies := benchRequests(prefixes, 512, formHashes)
	for i := range bodies {
		var req api.RouteRequest
		if err := api.DecodeRouteRequest(bodies[i], &req); err != nil {
			b.Fatal(err)
		}
		req.SessionID, req.SessionMode = fmt.Sprintf("bench-%s-%d", mode, i%64), mode
		bodies[i] = api.AppendRouteRequest(nil, &req)
	}
	measureLatency(b, natstest.Connect(b, st.srv), bodies) // the warm-up creates the 64 bindings
}
