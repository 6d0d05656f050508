package natstest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Option adjusts the server options before the server starts.
type Option func(*server.Options)

// WithMaxPayload raises the server's largest message size.
func WithMaxPayload(n int32) Option { return func(o *server.Options) { o.MaxPayload = n } }

// Start runs a single JetStream server on a random loopback port, stored in
// t.TempDir(), and shuts it down when the test ends.
func Start(t testing.TB, opts ...Option) *server.Server {
	t.Helper()
	o := &server.Options{
		ServerName: "test",
		Host:       "127.0.0.1",
		Port:       -1,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoLog:      true,
		NoSigs:     true,
	}
	for _, opt := range opts {
		opt(o)
	}
	s := run(t, o)
	t.Cleanup(s.Shutdown)
	return s
}

func run(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatalf("natstest: server %s not ready within 10s", o.ServerName)
	}
	return s
}

// Connect opens a client connection to s (over loopback TCP) and closes it
// when the test ends.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", s.ClientURL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream connects to s and returns a JetStream handle on that connection.
func JetStream(t testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// Cluster is a three-node JetStream cluster in one process.
type Cluster struct {
	Servers []*server.Server
	opts    []*server.Options
	t       testing.TB
}

// StartCluster runs n JetStream nodes clustered over loopback and waits
// until the meta leader sees all n peers. Nodes are shut down when the test
// ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: cluster size %d", n)
	}
	cports := freePorts(t, n)
	routes := make([]string, n)
	for i, p := range cports {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	c := &Cluster{t: t}
	for i := 0; i < n; i++ {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "test", Host: "127.0.0.1", Port: cports[i]},
			Routes:     server.RoutesFromStr(joinComma(routes)),
		}
		c.opts = append(c.opts, o)
	}
	for _, o := range c.opts {
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatalf("natstest: new cluster node: %v", err)
		}
		go s.Start()
		c.Servers = append(c.Servers, s)
	}
	t.Cleanup(c.Shutdown)
	for _, s := range c.Servers {
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("natstest: cluster node %s not ready", s.Name())
		}
	}
	c.WaitPeers(n, 15*time.Second)
	return c
}

// WaitPeers waits until the meta leader counts want JetStream peers that
// are online and have reported stats: only then can an R3 stream be placed
// ("no suitable peers for placement" otherwise).
func (c *Cluster) WaitPeers(want int, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, s := range c.Servers {
			if s.Running() && s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) >= want {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("natstest: no JetStream meta leader with %d peers within %v", want, timeout)
}

// URLs returns the client URLs of the running nodes, comma separated, for
// nats.Connect.
func (c *Cluster) URLs() string {
	var urls []string
	for _, s := range c.Servers {
		if s.Running() {
			urls = append(urls, s.ClientURL())
		}
	}
	return joinComma(urls)
}

// StreamLeader returns the index of the node leading stream, or -1.
func (c *Cluster) StreamLeader(stream string) int {
	for i, s := range c.Servers {
		if s.Running() && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i
		}
	}
	return -1
}

// Restart shuts node i down (if running) and starts it again on the same
// store directory and ports.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.Stop(i)
	c.Start(i)
}

// Stop shuts node i down and keeps it down (until Start). Its clients see
// the connection drop, as after a kill: the node does not hand over its
// leaderships first. Stopping a stopped node does nothing.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	c.Servers[i].Shutdown()
	c.Servers[i].WaitForShutdown()
}

// Start starts stopped node i again on its store directory and ports, and
// waits until it accepts connections (not until it has caught up: use
// WaitPeers or StreamLeader for that).
func (c *Cluster) Start(i int) {
	c.t.Helper()
	if c.Servers[i].Running() {
		c.t.Fatalf("natstest: start node %d: already running", i)
	}
	o := c.opts[i].Clone()
	s, err := server.NewServer(o)
	if err != nil {
		c.t.Fatalf("natstest: start node %d: %v", i, err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		c.t.Fatalf("natstest: started node %d not ready", i)
	}
	c.Servers[i] = s
}

// MetaLeader returns the index of the JetStream meta leader, or -1 while
// there is none (during an election).
func (c *Cluster) MetaLeader() int {
	for i, s := range c.Servers {
		if s.Running() && s.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// Index returns the index of the node named name ("n0".."n<N-1>", what
// JetStream reports as a cluster leader), or -1.
func (c *Cluster) Index(name string) int {
	for i, o := range c.opts {
		if o.ServerName == name {
			return i
		}
	}
	return -1
}

// ConsumerLeaders counts, per node index, the consumers of stream that the
// node leads (for a KV bucket's stream, its watchers' ordered consumers:
// the node that hosts them is where their deliveries come from). It asks
// the JetStream API through a connection of its own to a running node.
func (c *Cluster) ConsumerLeaders(ctx context.Context, stream string) (map[int]int, error) {
	var url string
	for _, s := range c.Servers {
		if s.Running() {
			url = s.ClientURL()
			break
		}
	}
	if url == "" {
		return nil, fmt.Errorf("natstest: consumers of %s: no node running", stream)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, fmt.Errorf("natstest: consumers of %s: connect %s: %w", stream, url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natstest: consumers of %s: %w", stream, err)
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("natstest: consumers of %s: %w", stream, err)
	}
	out := map[int]int{}
	list := st.ListConsumers(ctx)
	for ci := range list.Info() {
		if ci.Cluster != nil {
			if i := c.Index(ci.Cluster.Leader); i >= 0 {
				out[i]++
			}
		}
	}
	if err := list.Err(); err != nil {
		return nil, fmt.Errorf("natstest: consumers of %s: list: %w", stream, err)
	}
	return out, nil
}

// ConsumerHost returns the index of the node leading the most consumers of
// stream (ties: the lowest index), or -1 when it has none or they cannot
// be listed.
func (c *Cluster) ConsumerHost(ctx context.Context, stream string) int {
	counts, err := c.ConsumerLeaders(ctx, stream)
	if err != nil {
		return -1
	}
	best := -1
	for i := range c.Servers {
		if counts[i] > 0 && (best < 0 || counts[i] > counts[best]) {
			best = i
		}
	}
	return best
}

// Shutdown stops every node.
func (c *Cluster) Shutdown() {
	for _, s := range c.Servers {
		s.Shutdown()
	}
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	var ls []net.Listener
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("natstest: free port: %v", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}
