package host

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// benchStack is an embedded server, nWorkers registered workers (no
// engines: the benchmark measures routing, not serving) whose caches are
// announced through real KV events, and nReplicas replicas.
func benchStack(b *testing.B, nWorkers, nReplicas int) (*stack, [][]uint32) {
	b.Helper()
	return benchStackOn(b, nWorkers, nReplicas, nil)
}

// benchStackOn is benchStack on the given cluster (node 0; every stream
// and bucket, the bindings bucket included, with three replicas), or on
// a new embedded server when c is nil.
func benchStackOn(b *testing.B, nWorkers, nReplicas int, c *natstest.Cluster) (*stack, [][]uint32) {
	b.Helper()
	opts := stackOpts{replicas: nReplicas}
	streamReplicas := 1
	if c != nil {
		opts.srv, streamReplicas = c.Servers[0], len(c.Servers)
	}
	opts.mutate = func(i int, c *Config) {
		c.StreamReplicas = streamReplicas
		c.HTTPAddr = ""
		c.Telemetry = Telemetry{} // no-op providers: measure the router, not the exporter
		c.MetricsHandler = nil
		c.Logger = slog.New(slog.DiscardHandler)
		if os.Getenv("KVR_BENCH_NOPRED") != "" {
			c.PredictedTTL = -1
		}
		if d, err := time.ParseDuration(os.Getenv("KVR_BENCH_PREDTTL")); err == nil {
			c.PredictedTTL = d
		}
	}
	st := startStack(b, opts)
	ctx := context.Background()
	rc := testRegistry()
	rc.TTL, rc.Heartbeat = 30*time.Second, 5*time.Second
	rc.Replicas = streamReplicas
	// A few shared prefixes cached on each worker, as events.
	prefixes := benchPrefixes()
	for w := 0; w < nWorkers; w++ {
		id := fmt.Sprintf("bw-%d", w)
		reg, err := workers.Register(ctx, st.js, rc, workers.Info{ID: id, Model: testModel, Endpoint: "kvr.worker.m." + id + ".generate",
			Ranks: []uint32{0}, BlockSize: 16, KVBlocks: 1 << 20, MaxBatchedTokens: 1 << 20, MaxSeqs: 1 << 16, Epoch: uint64(w + 1), State: workers.StateReady})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(reg.Stop)
		pub, err := kvevents.NewPublisher(st.js, kvevents.PublisherConfig{Model: testModel, Worker: id, Epoch: uint64(w + 1)})
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range [][]uint32{prefixes[w%len(prefixes)], prefixes[(w+1)%len(prefixes)]} {
			h := kvevents.SeqHashes(nil, p, 16, kvevents.HashSeed)
			ev := kvevents.Event{Kind: kvevents.KindStored}
			for j, x := range h {
				ev.Blocks = append(ev.Blocks, kvevents.StoredBlock{Engine: kvevents.EngineHash(uint64(w)<<32 | uint64(j) | uint64(len(ev.Blocks))<<48), Seq: x})
			}
			if err := pub.Emit(ev); err != nil {
				b.Fatal(err)
			}
		}
		if err := pub.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
	st.waitWorkers(nWorkers)
	testutil.Eventually(b, 10*time.Second, func() bool {
		for _, r := range st.replicas {
			if r.models[testModel].index.Stats().Entries < int64(nWorkers*64) {
				return false
			}
		}
		return true
	}, func() string {
		msg := fmt.Sprintf("events not indexed: want %d entries per replica, have", nWorkers*64)
		for _, r := range st.replicas {
			in := r.intake
			msg += fmt.Sprintf(" %d (batches applied %d, held %d, released %d, dropped %d, lag %d)", r.models[testModel].index.Stats().Entries,
				in.applied.Load(), in.hold.held.Load(), in.hold.released.Load(), in.hold.dropped.Load(), in.lag.Load())
		}
		return msg
	})
	return st, prefixes
}

// benchPrefixes are the 16 shared 1,024-token prefixes of the route
// benchmarks' bodies.
func benchPrefixes() [][]uint32 {
	prefixes := make([][]uint32, 16)
	for i := range prefixes {
		prefixes[i] = tokens(1000+i, 1024)
	}
	return prefixes
}

// bodyForm is how a benchmark's route bodies carry their prompts.
type bodyForm string

const (
	formTokens     bodyForm = "tokens"      // token ids in the token trailer, as api.Client sends them
	formTokensJSON bodyForm = "tokens-json" // token ids in the JSON, as an HTTP client sends them
	formHashes     bodyForm = "hashes"      // 128 precomputed block hashes in the hash trailer, as api.Client sends them
	formHashesJSON bodyForm = "hashes-json" // the same hashes in the JSON, as an HTTP client sends them
)

// benchRequests builds session-less 2,048-token requests in form: half
// share a cached 1,024-token prefix, half are fresh.
func benchRequests(prefixes [][]uint32, n int, form bodyForm) [][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([][]byte, n)
	for i := range out {
		toks := make([]uint32, 0, 2048)
		if i%2 == 0 {
			toks = append(toks, prefixes[r.IntN(len(prefixes))]...)
		}
		for len(toks) < 2048 {
			toks = append(toks, uint32(r.IntN(100_000)))
		}
		req := &api.RouteRequest{Model: testModel, TokenIDs: toks, ExpectedOutputTokens: 128}
		switch form {
		case formTokens:
			out[i] = api.AppendRouteBody(nil, req)
		case formTokensJSON:
			out[i] = api.AppendRouteRequest(nil, req)
		case formHashes:
			hashed := req.AsBlockHashes(16)
			out[i] = api.AppendRouteBody(nil, &hashed)
		case formHashesJSON:
			hashed := req.AsBlockHashes(16)
			out[i] = api.AppendRouteRequest(nil, &hashed)
		default:
			panic("unknown body form " + form)
		}
	}
	return out
}

// routeOnce sends one route request and frees the booking with a
// fire-and-forget publish (no reply), as a client that does not wait for
// the acknowledgement would. It returns the client-to-client latency.
func routeOnce(b *testing.B, nc *nats.Conn, subject string, body []byte, resp *api.RouteResponse, lc []byte) time.Duration {
	t0 := time.Now()
	reply, err := nc.Request(subject, body, 5*time.Second)
	d := time.Since(t0)
	if err != nil {
		b.Fatal(err)
	}
	if e := api.DecodeError(reply.Data); e != nil && reply.Header.Get(api.HeaderStatus) != "" {
		b.Fatal(e)
	}
	if err := api.DecodeRouteResponse(reply.Data, resp); err != nil {
		b.Fatal(err)
	}
	lc = append(lc[:0], `{"request_id":"`...)
	lc = append(lc, resp.RequestID...)
	lc = append(lc, `","model":"m","fence":"`...)
	lc = append(lc, resp.Fence...) // hex: no escaping needed
	lc = append(lc, `"}`...)
	if err := nc.Publish(api.ReplicaSubject("", resp.Replica, api.OpFree), lc); err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkRouteNATS measures routing through the NATS API: session-less
// 2,048-token requests (token ids in JSON) on an embedded server with 8
// workers. Throughput with concurrent clients (routes/s) and the latency
// of a single client (p50/p99 client to client).
func BenchmarkRouteNATS(b *testing.B) {
	for _, c := range []struct {
		form bodyForm
		nrep int
	}{{formTokens, 1}, {formTokens, 2}, {formTokensJSON, 1}, {formHashes, 1}, {formHashes, 2}, {formHashesJSON, 1}} {
		nrep, form := c.nrep, c.form
		b.Run(fmt.Sprintf("%s/replicas=%d/throughput", form, nrep), func(b *testing.B) {
			st, prefixes := benchStack(b, 8, nrep)
			measureThroughput(b, st.srv, benchRequests(prefixes, 512, form))
		})
		b.Run(fmt.Sprintf("%s/replicas=%d/latency", form, nrep), func(b *testing.B) {
			st, prefixes := benchStack(b, 8, nrep)
			measureLatency(b, natstest.Connect(b, st.srv), benchRequests(prefixes, 512, form))
		})
	}
}

// measureThroughput routes bodies round and round from 16 x GOMAXPROCS
// goroutines over four client connections to srv, and reports routes/s
// and the CPU of the whole process (client, server, replicas) per route:
// on a shared machine this, not routes/s, says what two dedicated cores
// would do.
func measureThroughput(b *testing.B, srv *server.Server, bodies [][]byte) {
	subject := api.RouteSubject("", testModel)
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
			routeOnce(b, nc, subject, bodies[int(next.Add(1))%len(bodies)], &resp, lc)
		}
	})
	el := time.Since(t0)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el.Seconds(), "routes/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/route")
}

// measureLatency routes bodies round and round from one client, after 200
// warm-up requests, and reports the p50 and p99 client to client.
func measureLatency(b *testing.B, nc *nats.Conn, bodies [][]byte) {
	subject := api.RouteSubject("", testModel)
	var resp api.RouteResponse
	var lc []byte
	for i := 0; i < 200; i++ {
		routeOnce(b, nc, subject, bodies[i%len(bodies)], &resp, lc)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		lat = append(lat, routeOnce(b, nc, subject, bodies[i%len(bodies)], &resp, lc))
	}
	b.StopTimer()
	reportQuantiles(b, lat, 0.5, 0.99)
}

// cpuTime is the CPU time (user + system) used by this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRouteInProcess is Replica.Route without NATS: decode excluded,
// hashing, lookup, scheduling and booking included (the replica's own cost
// per route), with 32 workers (issue 29's fleet). p50-µs is the median
// route, ns/op the mean of route and free.
func BenchmarkRouteInProcess(b *testing.B) { benchRouteInProcess(b, 32, nil) }

// benchRouteInProcess routes 64 request bodies round and round through
// Replica.Route on nWorkers workers, freeing each booking at once; edit,
// when set, changes each decoded request first.
func benchRouteInProcess(b *testing.B, nWorkers int, edit func(i int, req *api.RouteRequest)) {
	st, prefixes := benchStack(b, nWorkers, 1)
	r := st.replicas[0]
	ms := r.models[testModel]
	bodies := benchRequests(prefixes, 64, formTokens)
	reqs := make([]api.RouteRequest, len(bodies))
	for i := range bodies {
		if err := api.DecodeRouteRequest(bodies[i], &reqs[i]); err != nil {
			b.Fatal(err)
		}
		if edit != nil {
			edit(i, &reqs[i])
		}
	}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := reqs[i%len(reqs)]
		req.RequestID = ""
		var resp api.RouteResponse
		t0 := time.Now()
		if err := r.Route(ctx, &req, &resp); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		fe, _ := ms.fences.get(resp.RequestID)
		_ = ms.sched.Free(fe)
		ms.fences.del(fe)
	}
	b.StopTimer()
	reportQuantiles(b, lat, 0.5)
}

// reportQuantiles reports the given quantiles of lat as p<q>-µs metrics
// (0.5 is p50-µs, 0.99 p99-µs).
func reportQuantiles(b *testing.B, lat []time.Duration, qs ...float64) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	for _, q := range qs {
		v := float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) / 1e3
		b.ReportMetric(v, "p"+strconv.Itoa(int(math.Round(q*100)))+"-µs")
	}
}
