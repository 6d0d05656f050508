package host

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/nats-io/nats.go"
)

// BenchmarkNATSFloor is BenchmarkRouteNATS's throughput case with
// the replica replaced by the cheapest responder NATS allows: it answers
// every route request with the same prepared reply (a real route answer's
// bytes) without reading it, and drops the frees. Same server, same four
// client connections, same 16 x GOMAXPROCS requests in flight, same
// bodies, same three messages per route. What it measures is the
// transport's share of a route on this machine: routes/s here bounds
// what any replica can reach over NATS with its client on the same cores
// (issue 29's "why it cannot go").
func BenchmarkNATSFloor(b *testing.B) {
	for _, form := range []string{"tokens", "hashes"} {
		b.Run(form, func(b *testing.B) {
			srv := natstest.Start(b)
			prefixes := make([][]uint32, 16)
			for i := range prefixes {
				prefixes[i] = tokens(1000+i, 1024)
			}
			reqs := benchRequests(prefixes, 512, form == "hashes")
			subject := api.RouteSubject("", testModel)

			rc := natstest.Connect(b, srv)
			reply := api.AppendRouteResponse(nil, &api.RouteResponse{V: 1, RequestID: "floor-0123456789abcdef", Model: testModel,
				Worker: "bw-3", Endpoint: "kvr.worker.m.bw-3.generate", OverlapBlocks: 64, PromptBlocks: 128, Attempt: 1,
				Fence: "0123456789abcdef0123456789abcdef", Replica: "floor"})
			var served, freed atomic.Int64
			if _, err := rc.QueueSubscribe(subject, "kvr-route", func(m *nats.Msg) {
				served.Add(1)
				_ = m.Respond(reply)
			}); err != nil {
				b.Fatal(err)
			}
			if _, err := rc.Subscribe(api.ReplicaSubject("", "floor", api.OpFree), func(*nats.Msg) { freed.Add(1) }); err != nil {
				b.Fatal(err)
			}
			if err := rc.Flush(); err != nil {
				b.Fatal(err)
			}

			conns := make([]*nats.Conn, 4)
			for i := range conns {
				conns[i] = natstest.Connect(b, srv)
			}
			var next atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			t0 := time.Now()
			cpu0 := cpuTime()
			b.RunParallel(func(pb *testing.PB) {
				nc := conns[int(next.Add(1))%len(conns)]
				var resp api.RouteResponse
				var lc []byte
				for pb.Next() {
					routeOnce(b, nc, subject, reqs[int(next.Add(1))%len(reqs)], &resp, lc)
				}
			})
			el := time.Since(t0)
			cpu := cpuTime() - cpu0
			b.StopTimer()
			if served.Load() < int64(b.N) {
				b.Fatalf("served %d of %d routes", served.Load(), b.N)
			}
			b.ReportMetric(float64(b.N)/el.Seconds(), "routes/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/route")
		})
	}
}
