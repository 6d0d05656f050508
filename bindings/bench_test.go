package bindings

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// Benchmarks of the commit protocol. Each op of the commit benchmarks is one
// Route that writes (a create, or a Soft re-bind); per-op latencies are
// reported as p50-µs and p99-µs next to ns/op. BareKVUpdate measures a
// plain kv.Update on the same server, the floor the commit adds to.

// timings records per-op latencies and reports their percentiles.
type timings []time.Duration

func (ts timings) report(b *testing.B) {
	if len(ts) == 0 {
		return
	}
	s := slices.Clone(ts)
	slices.Sort(s)
	q := func(p float64) float64 {
		return float64(s[min(len(s)-1, int(p*float64(len(s))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

type benchConn struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func benchCommit(b *testing.B, conn benchConn, replicas int) {
	ctx := context.Background()
	b.Run("create", func(b *testing.B) {
		bucket := fmt.Sprintf("bc%d", time.Now().UnixNano())
		tb := openOn(b, conn.js, conn.nc, Config{Bucket: bucket, Replicas: replicas})
		sel := always("w1")
		sessions := make([]string, b.N)
		for i := range sessions {
			sessions[i] = fmt.Sprintf("session-%08d", i)
		}
		timeRoutes(b, tb, func(i int) string { return sessions[i] }, sel, Created)
		_ = conn.js.DeleteKeyValue(ctx, bucket)
	})
	b.Run("rebind", func(b *testing.B) {
		bucket := fmt.Sprintf("br%d", time.Now().UnixNano())
		tb := openOn(b, conn.js, conn.nc, Config{Bucket: bucket, Replicas: replicas, DefaultMode: session.Soft})
		// Each request selects the worker it is not bound to: a Soft re-bind.
		flip := func(_ context.Context, req *Requirement) (workerref.Target, error) {
			if req == nil || req.Target.Worker == "w2" {
				return workerref.Any("w1"), nil
			}
			return workerref.Any("w2"), nil
		}
		if _, err := tb.Route(ctx, model, "s", flip); err != nil {
			b.Fatal(err)
		}
		timeRoutes(b, tb, func(int) string { return "s" }, flip, Rebound)
		_ = conn.js.DeleteKeyValue(ctx, bucket)
	})
}

// timeRoutes times b.N Routes of session(i), each of which must end in
// want, and reports their latency percentiles.
func timeRoutes(b *testing.B, tb *Table, session func(i int) string, sel Selector, want Outcome) {
	ctx := context.Background()
	ts := make(timings, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := session(i)
		t0 := time.Now()
		res, err := tb.Route(ctx, model, s, sel)
		ts[i] = time.Since(t0)
		if err != nil || res.Outcome != want {
			b.Fatalf("op %d: %v %v", i, res.Outcome, err)
		}
	}
	b.StopTimer()
	ts.report(b)
}

func benchBareUpdate(b *testing.B, conn benchConn, replicas int) {
	ctx := context.Background()
	bucket := fmt.Sprintf("bu%d", time.Now().UnixNano())
	var kv jetstream.KeyValue
	var err error
	for try := 0; try < 50; try++ { // a cluster just started may lack peers for R3 (10005)
		if kv, err = conn.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Replicas: replicas}); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer conn.js.DeleteKeyValue(ctx, bucket)
	rev, err := kv.Create(ctx, "k", []byte(`{"worker":"w1"}`))
	if err != nil {
		b.Fatal(err)
	}
	val := []byte(`{"model":"llama","session":"s","worker":"w1","mode":"soft","version":2,"writer":"r-1","created":"2026-01-02T03:04:05Z","renewed":"2026-01-02T03:04:05Z","ttl_s":600,"nonce":"abc-0"}`)
	ts := make(timings, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		rev, err = kv.Update(ctx, "k", val, rev)
		ts[i] = time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	ts.report(b)
}

// BenchmarkCommitSingle: create and re-bind on one embedded server (R1).
// Target p50 ≤ 60 µs.
func BenchmarkCommitSingle(b *testing.B) {
	s := natstest.Start(b)
	nc, js := natstest.JetStream(b, s)
	benchCommit(b, benchConn{nc, js}, 1)
}

// BenchmarkCommitCluster: create and re-bind on a 3-node in-process cluster
// with an R3 bucket. Target p50 ≤ 250 µs.
func BenchmarkCommitCluster(b *testing.B) {
	c := natstest.StartCluster(b, 3)
	nc, js := c.ConnectFrom(b, 0)
	benchCommit(b, benchConn{nc, js}, 3)
}

// BenchmarkBareKVUpdate: kv.Update CAS alone, the reference floor.
func BenchmarkBareKVUpdate(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		s := natstest.Start(b)
		nc, js := natstest.JetStream(b, s)
		benchBareUpdate(b, benchConn{nc, js}, 1)
	})
	b.Run("cluster", func(b *testing.B) {
		c := natstest.StartCluster(b, 3)
		nc, js := c.ConnectFrom(b, 0)
		benchBareUpdate(b, benchConn{nc, js}, 3)
	})
}

// BenchmarkRouteFresh: a request of a session whose binding is fresh and
// agrees with selection, the hot path (no KV write), under each read rule:
// a Soft binding from the provably fresh cache (no round trip, no
// allocation), a Hard binding from the stream leader (one STREAM.MSG.GET),
// and StrictReads (every read from the leader). On one embedded server and
// on a 3-node in-process cluster with an R3 bucket (the reader connected to
// node 0, wherever the stream leader is).
func BenchmarkRouteFresh(b *testing.B) {
	type setup struct {
		name     string
		replicas int
		conn     func(b *testing.B) benchConn
	}
	setups := []setup{
		{"single", 1, func(b *testing.B) benchConn {
			nc, js := natstest.JetStream(b, natstest.Start(b))
			return benchConn{nc, js}
		}},
		{"cluster", 3, func(b *testing.B) benchConn {
			nc, js := natstest.StartCluster(b, 3).ConnectFrom(b, 0)
			return benchConn{nc, js}
		}},
	}
	reads := []struct {
		name   string
		mode   session.Mode
		strict bool
	}{
		{"soft", session.Soft, false}, {"hard", session.Hard, false}, {"strict", session.Soft, true},
	}
	for _, su := range setups {
		b.Run(su.name, func(b *testing.B) {
			conn := su.conn(b)
			for _, rd := range reads {
				b.Run(rd.name, func(b *testing.B) {
					bucket := fmt.Sprintf("bf%d", time.Now().UnixNano())
					tb := openOn(b, conn.js, conn.nc, Config{Bucket: bucket, Replicas: su.replicas, DefaultMode: rd.mode, StrictReads: rd.strict})
					defer conn.js.DeleteKeyValue(context.Background(), bucket)
					if _, err := tb.Route(context.Background(), model, "busy-session", always("w1")); err != nil {
						b.Fatal(err)
					}
					if !rd.strict {
						testutil.Eventually(b, 10*time.Second, func() bool { return tb.Stats().CacheFresh },
							func() string { return "the cache is not fresh" })
					}
					writes := tb.Stats().Writes
					timeRoutes(b, tb, func(int) string { return "busy-session" }, pick("w9"), Fresh)
					if w := tb.Stats().Writes; w != writes {
						b.Fatalf("fresh path wrote %d times", w-writes)
					}
				})
			}
		})
	}
}

// BenchmarkProbe: one freshness probe (a quorum mark, quorum.go),
// sent every MaxStaleness/4 by each replica.
func BenchmarkProbe(b *testing.B) {
	for _, cluster := range []bool{false, true} {
		b.Run(map[bool]string{false: "single", true: "cluster"}[cluster], func(b *testing.B) {
			var conn benchConn
			replicas := 1
			if cluster {
				conn.nc, conn.js = natstest.StartCluster(b, 3).ConnectFrom(b, 0)
				replicas = 3
			} else {
				conn.nc, conn.js = natstest.JetStream(b, natstest.Start(b))
			}
			tb := openOn(b, conn.js, conn.nc, Config{Replicas: replicas, StrictReads: true})
			ts := make(timings, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if _, err := tb.markWithin(time.Second); err != nil {
					b.Fatal(err)
				}
				ts[i] = time.Since(t0)
			}
			b.StopTimer()
			ts.report(b)
		})
	}
}
