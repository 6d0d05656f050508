package host

import (
	"testing"

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
	for _, form := range []bodyForm{formTokens, formTokensJSON, formHashes, formHashesJSON} {
		b.Run(string(form), func(b *testing.B) {
			srv := natstest.Start(b)
			reqs := benchRequests(benchPrefixes(), 512, form)
			subject := api.RouteSubject("", testModel)

			rc := natstest.Connect(b, srv)
			reply := api.AppendRouteResponse(nil, &api.RouteResponse{V: api.APIVersion, RequestID: "floor-0123456789abcdef", Model: testModel,
				Worker: "bw-3", Endpoint: "kvr.worker.m.bw-3.generate", OverlapBlocks: 64, PromptBlocks: 128, Attempt: 1,
				Fence: "0123456789abcdef0123456789abcdef", Replica: "floor"})
			if _, err := rc.QueueSubscribe(subject, "kvr-route", func(m *nats.Msg) { _ = m.Respond(reply) }); err != nil {
				b.Fatal(err)
			}
			if _, err := rc.Subscribe(api.ReplicaSubject("", "floor", api.OpFree), func(*nats.Msg) {}); err != nil {
				b.Fatal(err)
			}
			if err := rc.Flush(); err != nil {
				b.Fatal(err)
			}

			measureThroughput(b, srv, reqs)
		})
	}
}
