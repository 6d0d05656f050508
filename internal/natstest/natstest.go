package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/internal/natslog"
	"github.com/kvrouter/kvrouter/internal/testutil"
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

// StartConfig runs a server from the configuration file at path (as
// `nats-server -c path` would: the file's environment variables are read
// now), on a random loopback port and stored in t.TempDir() whatever the
// file says, and shuts it down when the test ends. Tests of a shipped
// configuration (deploy/nats/auth.conf) use it.
func StartConfig(t testing.TB, path string) *server.Server {
	t.Helper()
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("natstest: configuration %s: %v", path, err)
	}
	o.Host, o.Port, o.StoreDir = "127.0.0.1", server.RANDOM_PORT, t.TempDir()
	o.NoLog, o.NoSigs = true, true
	s := run(t, o)
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func run(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	s, err := launch(o)
	if err == nil {
		err = ready(t, s)
	}
	if err != nil {
		s.Shutdown() // nil-safe
		t.Fatal(err)
	}
	return s
}

// launch creates the server o describes and starts it in the background.
func launch(o *server.Options) (*server.Server, error) {
	s, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("natstest: new server %s: %w", o.ServerName, err)
	}
	s.SetLogger(&natslog.FatalLog{}, false, false)
	go s.Start()
	return s, nil
}

// ready waits until s accepts client and route connections. It stops early
// when s reports a fatal error (a port it could not listen on, JetStream
// that would not start), which would otherwise cost the whole budget.
func ready(t testing.TB, s *server.Server) error {
	budget := testutil.Budget(t)
	switch err := natslog.WaitReady(s, budget); {
	case errors.Is(err, natslog.ErrNotReady):
		return fmt.Errorf("natstest: server %s not ready within %v", s.Name(), budget)
	case err != nil:
		return fmt.Errorf("natstest: server %s did not start: %w", s.Name(), err)
	}
	return nil
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

// Cluster is a JetStream cluster of n nodes in one process.
type Cluster struct {
	Servers []*server.Server
	opts    []*server.Options
	t       testing.TB
	dir     string // holds every node's store directory
	starts  int    // launches so far: each gets fresh store directories

	// With Partitionable: links[i][j] carries node i's route connections
	// to node j (partition.go); clients are the client links handed out.
	partitionable bool
	links         [][]*Link
	clients       []*Link
	addrMu        sync.Mutex // guards clients and clientAddrs
	clientAddrs   []string   // each node's current client host:port, for client links
}

// ClusterOption adjusts how StartCluster builds the cluster.
type ClusterOption func(*Cluster)

// startAttempts bounds how often StartCluster picks new ports: a port
// freePorts found free can be taken by another process before its node
// listens on it.
const startAttempts = 3

// StartCluster runs n JetStream nodes clustered over loopback and waits
// until the meta leader sees all n peers current (WaitPeers). Every wait
// is bounded by the test's own deadline (testutil.Budget), not by a fixed
// time, so a loaded machine slows the start but does not fail it. Nodes
// are shut down when the test ends.
func StartCluster(t testing.TB, n int, opts ...ClusterOption) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: cluster size %d", n)
	}
	// The store directories' parent is made before the shutdown is
	// registered, so cleanups (last in, first out) stop every node before
	// its files are removed.
	c := &Cluster{t: t, dir: t.TempDir()}
	for _, o := range opts {
		o(c)
	}
	t.Cleanup(c.Shutdown)
	for attempt := 1; ; attempt++ {
		err := c.launch(n)
		if err == nil {
			break
		}
		c.Shutdown()
		if attempt == startAttempts {
			t.Fatalf("natstest: cluster of %d not started in %d attempts: %v", n, attempt, err)
		}
	}
	c.WaitPeers(n)
	return c
}

// launch starts n nodes on fresh ports and store directories and waits
// until each accepts connections.
func (c *Cluster) launch(n int) error {
	cports := freePorts(c.t, n)
	routes := make([]string, n)
	for i, p := range cports {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	if err := c.makeLinks(cports); err != nil {
		return err
	}
	c.opts, c.Servers = nil, nil
	c.starts++
	for i := 0; i < n; i++ {
		dir := filepath.Join(c.dir, fmt.Sprintf("start%d-n%d", c.starts, i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("natstest: store directory: %w", err)
		}
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   dir,
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "test", Host: "127.0.0.1", Port: cports[i]},
			Routes:     server.RoutesFromStr(joinComma(routes)),
		}
		if c.partitionable {
			o.Routes = server.RoutesFromStr(joinComma(c.routesVia(i)))
			o.Cluster.NoAdvertise = true // gossip must not reveal the direct ports
		}
		s, err := launch(o)
		if err != nil {
			return err
		}
		c.opts = append(c.opts, o)
		c.Servers = append(c.Servers, s)
	}
	for i, s := range c.Servers {
		if err := ready(c.t, s); err != nil {
			return err
		}
		c.setClientAddr(i, s)
	}
	return nil
}

// WaitPeers waits until the meta leader counts want JetStream peers that
// are online and have reported stats (only then can an R3 stream be placed:
// "no suitable peers for placement" otherwise) and every running node's
// copy of the meta state is current. Elections and stats reports arrive
// on the server's own timers (seconds apart), so the wait is bounded by
// the test's deadline (testutil.Budget), not by a fixed time.
func (c *Cluster) WaitPeers(want int) {
	c.t.Helper()
	testutil.Eventually(c.t, testutil.Budget(c.t), func() bool { return c.hasPeers(want) },
		func() string {
			return fmt.Sprintf("natstest: no JetStream meta leader with %d current peers: %s", want, c.state())
		})
}

func (c *Cluster) hasPeers(want int) bool {
	leader := c.MetaLeader()
	if leader < 0 || len(c.Servers[leader].JetStreamClusterPeers()) < want {
		return false
	}
	for _, s := range c.Servers {
		if s.Running() && !s.JetStreamIsCurrent() {
			return false
		}
	}
	return true
}

// state describes each node's view of the meta group, for a failed wait.
func (c *Cluster) state() string {
	var parts []string
	for i, s := range c.Servers {
		switch {
		case !s.Running():
			parts = append(parts, fmt.Sprintf("n%d down", i))
		case s.JetStreamIsLeader():
			parts = append(parts, fmt.Sprintf("n%d leader with peers %v", i, s.JetStreamClusterPeers()))
		default:
			parts = append(parts, fmt.Sprintf("n%d current=%v", i, s.JetStreamIsCurrent()))
		}
	}
	return strings.Join(parts, ", ")
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
	s, err := launch(c.opts[i].Clone())
	if err == nil {
		err = ready(c.t, s)
	}
	if err != nil {
		s.Shutdown() // nil-safe
		c.t.Fatalf("natstest: start node %d: %v", i, err)
	}
	c.Servers[i] = s
	c.setClientAddr(i, s)
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

// Shutdown stops every node and waits until each has closed its files,
// then closes the links.
func (c *Cluster) Shutdown() {
	for _, s := range c.Servers {
		s.Shutdown()
	}
	for _, s := range c.Servers {
		s.WaitForShutdown()
	}
	c.closeLinks()
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
