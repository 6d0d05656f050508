package natstest

import (
	"context"
	"testing"
	"time"

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
