package natstest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/jskv"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/nats-io/nats-server/v2/server"
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

// A port a node cannot listen on ends the start-up wait at once, with the
// reason, instead of after the whole budget (StartCluster then tries new
// ports).
func TestReadyReportsPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := launch(&server.Options{ServerName: "taken", Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Cluster: server.ClusterOpts{Name: "test", Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	start := time.Now()
	err = ready(t, s)
	if err == nil || !strings.Contains(err.Error(), "router port") {
		t.Fatalf("ready with the route port taken = %v, want an error naming the router port", err)
	}
	if waited := time.Since(start); waited > time.Minute {
		t.Fatalf("ready took %v to report a taken port", waited)
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
	if _, err := createR3(ctx, js, "c"); err != nil {
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
	kv, err := createR3(ctx, js, "c")
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
	c.WaitPeers(3)
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
}

// createR3 creates a bucket of three replicas as the product does
// (jskv.CreateWaitingForPeers): each try bounded, a lost reply tried again.
// A single CreateKeyValue under CI's load once waited out the test's whole
// 30 s for a reply that never came.
func createR3(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	return jskv.CreateWaitingForPeers(ctx, func(c context.Context) (jetstream.KeyValue, error) {
		return js.CreateKeyValue(c, jetstream.KeyValueConfig{Bucket: bucket, Replicas: 3})
	})
}
