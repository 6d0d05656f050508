package natstest

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ConnectFrom connects to the cluster preferring node first (then the
// others in order), reconnecting at once to the next node when one goes,
// and returns a JetStream handle on that connection. Connecting clients
// from different first nodes spreads them over the cluster, as replicas
// and workers are in production. The connection closes when the test ends.
func (c *Cluster) ConnectFrom(t testing.TB, first int) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	var urls []string
	for i := range c.Servers {
		urls = append(urls, c.Servers[(first+i)%len(c.Servers)].ClientURL())
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatalf("natstest: connect to cluster from node %d: %v", first, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}
