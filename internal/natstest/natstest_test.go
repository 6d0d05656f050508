package natstest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestStartServesJetStream(t *testing.T) {
	s := Start(t)
	_, js := JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func TestClusterElectsStreamLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster start takes seconds")
	}
	c := StartCluster(t, 3)
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "c", Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if c.StreamLeader("KV_c") < 0 {
		t.Fatal("no stream leader for KV_c")
	}
}

// Stop keeps a node down: another node takes over the meta leadership and
// the stream, the watch consumer is found on a running node, and Start
// brings the node back into the cluster.
func TestClusterStopAndStart(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster start and elections take seconds")
	}
	c := StartCluster(t, 3)
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "c", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	testutil.Eventually(t, 10*time.Second, func() bool { return c.ConsumerHost(ctx, "KV_c") >= 0 },
		func() string { return "no node hosts the watch consumer of KV_c" })

	meta := c.MetaLeader()
	if meta < 0 {
		t.Fatal("no meta leader")
	}
	c.Stop(meta)
	if c.Servers[meta].Running() {
		t.Fatalf("node %d still running after Stop", meta)
	}
	testutil.Eventually(t, 15*time.Second, func() bool { l := c.MetaLeader(); return l >= 0 && l != meta },
		func() string { return fmt.Sprintf("no new meta leader after stopping n%d", meta) })
	testutil.Eventually(t, 15*time.Second, func() bool { l := c.StreamLeader("KV_c"); return l >= 0 && l != meta },
		func() string { return "no KV_c leader on a running node" })
	c.Start(meta)
	c.WaitPeers(3, 15*time.Second)
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
}
