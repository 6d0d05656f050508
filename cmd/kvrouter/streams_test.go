package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workers"
)

// The event stream and the buckets keep the replicas (and limits) that
// `kvrouter serve --stream-replicas 3` gave them, whatever the order in
// which worker-side processes (`kvrouter worker`, `kvrouter bridge`: both
// set up through workerSideFlags.connect, then workers.Register) start. A
// worker side that starts first waits for the replica, and never creates
// the stream with its own one replica. (`kvrouter gateway` touches no
// stream or bucket: it only calls the route API.)
func TestStreamConfigSurvivesWorkerSide(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3-node NATS clusters and a router replica")
	}
	t.Run("replica first", func(t *testing.T) {
		c := natstest.StartCluster(t, 3)
		startR3Replica(t, c)
		if err := workerSide(t, c, "30s"); err != nil {
			t.Fatalf("worker side after the replica: %v", err)
		}
		if err := workerSide(t, c, "30s"); err != nil { // a second worker, a restart
			t.Fatalf("second worker side: %v", err)
		}
		checkR3(t, c)
	})
	t.Run("worker first fails clearly", func(t *testing.T) {
		c := natstest.StartCluster(t, 3)
		err := workerSide(t, c, "500ms")
		if !errors.Is(err, kvevents.ErrStreamMissing) {
			t.Fatalf("worker side with no replica: %v, want kvevents.ErrStreamMissing", err)
		}
		t.Logf("worker side with no replica: %v", err)
		nc, js := connectCluster(t, c)
		defer nc.Close()
		if _, err := js.Stream(context.Background(), kvevents.DefaultStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("the worker side created the stream (err %v)", err)
		}
		startR3Replica(t, c)
		if err := workerSide(t, c, "30s"); err != nil {
			t.Fatalf("worker side after the replica: %v", err)
		}
		checkR3(t, c)
	})
	t.Run("worker waiting while the replica starts", func(t *testing.T) {
		c := natstest.StartCluster(t, 3)
		done := make(chan error, 1)
		go func() { done <- workerSide(t, c, "60s") }()
		startR3Replica(t, c)
		if err := <-done; err != nil {
			t.Fatalf("waiting worker side: %v", err)
		}
		checkR3(t, c)
	})
}

func connectCluster(t *testing.T, c *natstest.Cluster) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// startR3Replica runs the replica as `kvrouter serve --stream-replicas 3`
// does, until the test ends.
func startR3Replica(t *testing.T, c *natstest.Cluster) {
	t.Helper()
	nc, _ := connectCluster(t, c)
	r, err := host.New(nc, host.Config{Models: []string{"m"}, StreamReplicas: 3, LoadSnapshot: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Close(ctx)
		nc.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatalf("replica start: %v", err)
	}
}

// workerSide does what `kvrouter worker` and `kvrouter bridge` do at start
// (connect, then register), then deregisters.
func workerSide(t *testing.T, c *natstest.Cluster, setupWait string) error {
	f := newFlags("test", "")
	nf := addNATSFlags(f, false)
	ws := addWorkerSideFlags(f, time.Millisecond, "nothing")
	if err := f.parse([]string{"--nats-url", c.URLs(), "--setup-wait", setupWait}); err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, js, err := ws.connect(ctx, nf, "test-worker", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg, err := workers.Register(ctx, js, ws.registry(log), workers.Info{ID: "w0", Model: "m", Endpoint: "kvr.worker.m.w0.generate",
		Ranks: []uint32{0}, BlockSize: 16, KVBlocks: 1024, MaxBatchedTokens: 8192, MaxSeqs: 64})
	if err != nil {
		return err
	}
	return reg.Deregister(ctx)
}

// checkR3 checks the replicas and limits of the event stream and of the
// registry, bindings and snapshot buckets.
func checkR3(t *testing.T, c *natstest.Cluster) {
	t.Helper()
	nc, js := connectCluster(t, c)
	defer nc.Close()
	for _, want := range []struct {
		stream   string
		maxBytes int64
	}{
		{kvevents.DefaultStream, host.DefaultEventMaxBytes},
		{"KV_" + workers.DefaultBucket, host.DefaultRegistryMaxBytes},
		{"KV_kvr-bindings", host.DefaultBindingsMaxBytes},
		{"OBJ_" + host.DefaultSnapshotBucket, -1},
	} {
		s, err := js.Stream(context.Background(), want.stream)
		if err != nil {
			t.Errorf("stream %s: %v", want.stream, err)
			continue
		}
		if got := s.CachedInfo().Config; got.Replicas != 3 || got.MaxBytes != want.maxBytes {
			t.Errorf("stream %s: replicas %d, max bytes %d; want 3 and %d", want.stream, got.Replicas, got.MaxBytes, want.maxBytes)
		}
	}
}
