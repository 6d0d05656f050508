package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Streams of the buckets whose leaders the fault test stops.
const (
	BindingsStream = "KV_" + bindings.DefaultBucket
	WorkersStream  = "KV_" + workers.DefaultBucket
)

// Node roles a fault can target.
const (
	RoleBindingsLeader   = "bindings-leader"   // leader of KV_kvr-bindings
	RoleMetaLeader       = "meta-leader"       // JetStream meta leader
	RoleWorkersLeader    = "workers-leader"    // leader of KV_kvr-workers
	RoleBindingsWatchers = "bindings-watchers" // node hosting the replicas' watch consumers of KV_kvr-bindings
	// RoleAnother is a running node not already picked for the same
	// fault: with it, a fault stops two of the three nodes (the cluster
	// loses its quorum).
	RoleAnother = "another"
)

// FleetConfig is the fleet under test. Zero fields take the defaults named.
type FleetConfig struct {
	Model    string // default "m"
	Replicas int    // router replicas, one per cluster node in turn; default 3
	Workers  int    // registered workers; default 4
	// Registry is the registry configuration of workers and replicas
	// (Replicas is set to 3). The zero value is production's: TTL 3 s,
	// heartbeat 1 s.
	Registry workers.RegistryConfig
	// Bindings is the replicas' bindings configuration (Replicas is set
	// to 3). The zero value is production's (idle TTL 10 min, leader
	// reads only where the cache cannot answer).
	Bindings bindings.Config
	Logger   *slog.Logger // default: discard
	// Partitions starts the cluster Partitionable: every route and client
	// connection passes through a link the test can cut (partition.go).
	Partitions bool
}

func (c *FleetConfig) defaults() {
	if c.Model == "" {
		c.Model = "m"
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	c.Registry.Replicas = 3
	c.Bindings.Replicas = 3
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry.Logger == nil {
		c.Registry.Logger = c.Logger
	}
}

// Fleet is a three-node JetStream cluster with router replicas (each on
// its own connection, preferring its own node) and registered workers
// (heartbeats only: the route API names a worker without contacting it).
type Fleet struct {
	t       testing.TB
	cfg     FleetConfig
	Cluster *natstest.Cluster
	Workers []string // worker ids

	observer *workers.Membership

	mu       sync.Mutex
	departed []Departure
	drops    []time.Time // when a replica's connection dropped or a replica closed
	cuts     []window    // when the network was partitioned
	heals    []time.Time // every heal of a cut (a flap heals many times)
	kills    []Kill
	replicas []*replica
	regs     []*workers.Registration
	conns    []*nats.Conn
}

// replica is one router replica and its connection; gen counts restarts.
type replica struct {
	r     *host.Replica
	nc    *nats.Conn
	links []*natstest.Link // its client links, with Partitions
	url   string           // HTTP API base URL
	node  int
	gen   int
	down  bool
}

// StartFleet starts the cluster, the replicas and the workers, and waits
// until every replica sees every worker. Everything stops when the test
// ends.
func StartFleet(t testing.TB, cfg FleetConfig) *Fleet {
	t.Helper()
	cfg.defaults()
	var copts []natstest.ClusterOption
	if cfg.Partitions {
		copts = append(copts, natstest.Partitionable())
	}
	f := &Fleet{t: t, cfg: cfg, Cluster: natstest.StartCluster(t, 3, copts...)}
	t.Cleanup(f.close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < cfg.Replicas; i++ {
		rp, err := f.startReplica(ctx, i, 0)
		if err != nil {
			t.Fatalf("chaos: replica %d: %v", i, err)
		}
		f.replicas = append(f.replicas, rp)
	}
	for i := 0; i < cfg.Workers; i++ {
		// A fresh cluster's registry stream may still be electing its
		// leader ("no response from stream"): retry as a worker would.
		f.regs = append(f.regs, f.registerRetrying(ctx, t, i, 30*time.Second, "chaos: register"))
		f.Workers = append(f.Workers, fmt.Sprintf("w%d", i))
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return f.allSee(cfg.Workers) },
		func() string { return fmt.Sprintf("replicas do not all see %d workers", cfg.Workers) })
	f.observe(ctx)
	return f
}

// register registers worker i ("w<i>"), connected to node i%3 first.
func (f *Fleet) register(ctx context.Context, i int) (*workers.Registration, error) {
	id := fmt.Sprintf("w%d", i)
	js, err := jetstream.New(f.Connect(i%3, nil))
	if err != nil {
		return nil, err
	}
	return workers.Register(ctx, js, f.cfg.Registry, workers.Info{ID: id, Model: f.cfg.Model, Endpoint: "kvr.chaos." + id,
		Ranks: []uint32{0}, BlockSize: 16, KVBlocks: 4096, MaxBatchedTokens: 8192, MaxSeqs: 256})
}

// registerRetrying registers worker i, retrying for up to within; it fails
// t with what, the worker and the last error when the time runs out.
func (f *Fleet) registerRetrying(ctx context.Context, t testing.TB, i int, within time.Duration, what string) *workers.Registration {
	t.Helper()
	var (
		reg     *workers.Registration
		lastErr error
	)
	testutil.Eventually(t, within, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		reg, lastErr = f.register(rctx, i)
		return lastErr == nil
	}, func() string { return fmt.Sprintf("%s w%d: %v", what, i, lastErr) })
	return reg
}

// KillWorkersOn crashes the workers connected to node (their heartbeats
// stop; their keys expire as after a crash) and returns their indexes.
func (f *Fleet) KillWorkersOn(rec *Recorder, node int) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var killed []int
	for i, reg := range f.regs {
		if i%3 != node || reg == nil {
			continue
		}
		reg.Stop()
		f.regs[i] = nil
		f.kills = append(f.kills, Kill{Worker: f.Workers[i], At: rec.Now()})
		killed = append(killed, i)
	}
	return killed
}

// RestartWorkers registers the killed workers again (new incarnations).
func (f *Fleet) RestartWorkers(ctx context.Context, killed []int) {
	f.t.Helper()
	for _, i := range killed {
		// The old incarnation's key must expire first (its TTL, counted by
		// the registry's stream leader, which may itself be electing).
		reg := f.registerRetrying(ctx, f.t, i, 90*time.Second, "chaos: register again")
		f.mu.Lock()
		f.regs[i] = reg
		f.mu.Unlock()
	}
}

// Kill is a worker crash the test caused.
type Kill struct {
	Worker string
	At     time.Duration // on the recorder's clock
}

// Kills lists the workers killed so far.
func (f *Fleet) Kills() []Kill {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Kill(nil), f.kills...)
}

// Departure is a worker departure an observing membership view reported.
// The fault test's workers never stop: every departure is a false one.
type Departure struct {
	Worker string
	At     time.Time
}

// observe watches the registry as a replica does (on a connection of its
// own) and notes every departure.
func (f *Fleet) observe(ctx context.Context) {
	js, err := jetstream.New(f.Connect(0, nil))
	if err != nil {
		f.t.Fatal(err)
	}
	m, err := workers.WatchMembership(ctx, js, f.cfg.Registry, workers.Callbacks{OnDepart: func(i workers.Info) {
		f.mu.Lock()
		f.departed = append(f.departed, Departure{Worker: i.ID, At: time.Now()})
		f.mu.Unlock()
	}})
	if err != nil {
		f.t.Fatalf("chaos: watch membership: %v", err)
	}
	f.observer = m
}

// Departures returns the departures observed so far.
func (f *Fleet) Departures() []Departure {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Departure(nil), f.departed...)
}

// Connect opens a connection that prefers node first and fails over to the
// others, reconnecting forever. onDrop, when set, is called whenever the
// connection drops.
func (f *Fleet) Connect(first int, onDrop func()) *nats.Conn {
	nc, _ := f.connect(first, onDrop)
	return nc
}

// connect is Connect, also returning the client links the connection may
// use (with Partitions; none otherwise).
func (f *Fleet) connect(first int, onDrop func()) (*nats.Conn, []*natstest.Link) {
	f.t.Helper()
	var (
		urls  []string
		links []*natstest.Link
	)
	for i := range f.Cluster.Servers {
		n := (first + i) % len(f.Cluster.Servers)
		if f.cfg.Partitions {
			l := f.Cluster.ClientLink(n)
			links = append(links, l)
			urls = append(urls, "nats://"+l.Addr())
			continue
		}
		urls = append(urls, f.Cluster.Servers[n].ClientURL())
	}
	opts := []nats.Option{nats.DontRandomize(), nats.IgnoreDiscoveredServers(), nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0), nats.Timeout(2 * time.Second),
		// Writes to a stopped node fail on purpose here: no log lines.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}
	if onDrop != nil {
		opts = append(opts, nats.DisconnectErrHandler(func(*nats.Conn, error) { onDrop() }))
	}
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		f.t.Fatalf("chaos: connect: %v", err)
	}
	f.mu.Lock()
	f.conns = append(f.conns, nc)
	f.mu.Unlock()
	return nc, links
}

func (f *Fleet) startReplica(ctx context.Context, i, gen int) (*replica, error) {
	nc, links := f.connect(i%3, f.replicaDropped)
	cfg := host.Config{
		ReplicaID:      fmt.Sprintf("rep-%d.%d", i, gen),
		Models:         []string{f.cfg.Model},
		StreamReplicas: 3,
		Registry:       f.cfg.Registry,
		Bindings:       f.cfg.Bindings,
		HTTPAddr:       "127.0.0.1:0",
		Logger:         f.cfg.Logger.With("replica", i),
	}
	r, err := host.New(nc, cfg)
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		_ = r.Close(context.Background())
		return nil, err
	}
	return &replica{r: r, nc: nc, links: links, url: "http://" + r.HTTPAddr(), node: i % 3, gen: gen}, nil
}

// replicaDropped notes that a replica lost its connection (or closed):
// requests delivered to it may go unanswered.
func (f *Fleet) replicaDropped() {
	f.mu.Lock()
	f.drops = append(f.drops, time.Now())
	f.mu.Unlock()
}

// replicaDropBetween reports whether a replica's connection dropped, or a
// replica closed, between from and to.
func (f *Fleet) replicaDropBetween(from, to time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.drops {
		if !d.Before(from) && !d.After(to) {
			return true
		}
	}
	return false
}

// allSee reports whether every running replica lists n workers.
func (f *Fleet) allSee(n int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, rp := range f.replicas {
		if rp.down {
			continue
		}
		w, err := rp.r.Workers(f.cfg.Model)
		if err != nil || len(w.Workers) != n {
			return false
		}
	}
	return true
}

// Model is the model the fleet routes.
func (f *Fleet) Model() string { return f.cfg.Model }

// httpTarget returns the base URL of replica i and whether it is up.
func (f *Fleet) httpTarget(i int) (url string, up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rp := f.replicas[i%len(f.replicas)]
	return rp.url, !rp.down
}

// Replicas is the number of replica slots.
func (f *Fleet) Replicas() int { return len(f.replicas) }

// NodeFor returns the node that holds role now, or -1.
func (f *Fleet) NodeFor(ctx context.Context, role string) int {
	switch role {
	case RoleBindingsLeader:
		return f.Cluster.StreamLeader(BindingsStream)
	case RoleWorkersLeader:
		return f.Cluster.StreamLeader(WorkersStream)
	case RoleMetaLeader:
		return f.Cluster.MetaLeader()
	case RoleBindingsWatchers:
		return f.Cluster.ConsumerHost(ctx, BindingsStream)
	}
	return -1
}

// another returns the lowest running node not in picked, or -1.
func (f *Fleet) another(picked map[int]bool) int {
	for i, s := range f.Cluster.Servers {
		if !picked[i] && s.Running() {
			return i
		}
	}
	return -1
}

// RolesOf lists the roles node holds now.
func (f *Fleet) RolesOf(ctx context.Context, node int) []string {
	var out []string
	for _, role := range []string{RoleBindingsLeader, RoleMetaLeader, RoleWorkersLeader, RoleBindingsWatchers} {
		if f.NodeFor(ctx, role) == node {
			out = append(out, role)
		}
	}
	return out
}

// Fault is one stop and restart as it happened.
type Fault struct {
	Target   string        // the role asked for, or "replica <i>"
	Nodes    []int         // nodes stopped (none for a replica)
	Roles    []string      // roles the stopped nodes held
	At, Back time.Duration // stop and restart, on the recorder's clock
	// Recovered is when the cluster had its peers and both buckets a
	// leader again (for a replica: when the new one was ready).
	Recovered time.Duration
}

func (f Fault) String() string {
	if len(f.Nodes) == 0 {
		return fmt.Sprintf("%s down %.3fs-%.3fs (%v), ready again at %.3fs", f.Target, f.At.Seconds(), f.Back.Seconds(),
			(f.Back - f.At).Round(time.Millisecond), f.Recovered.Seconds())
	}
	nodes := make([]string, len(f.Nodes))
	for i, n := range f.Nodes {
		nodes[i] = fmt.Sprintf("n%d", n)
	}
	return fmt.Sprintf("%s (%s holding %s) down %.3fs-%.3fs (%v), recovered at %.3fs", f.Target, strings.Join(nodes, "+"),
		strings.Join(f.Roles, ","), f.At.Seconds(), f.Back.Seconds(), (f.Back - f.At).Round(time.Millisecond), f.Recovered.Seconds())
}

// StopNodes stops the nodes holding roles (all at once), keeps them down
// for down, starts them again and waits until the cluster has recovered.
func (f *Fleet) StopNodes(ctx context.Context, rec *Recorder, down time.Duration, roles ...string) Fault {
	f.t.Helper()
	fault := Fault{Target: strings.Join(roles, "+")}
	seen := map[int]bool{}
	for _, role := range roles {
		n := f.NodeFor(ctx, role)
		if role == RoleAnother {
			n = f.another(seen)
		}
		if n < 0 && role == RoleBindingsWatchers {
			// No watcher (replicas with strict reads): stop the bindings
			// leader instead, so that the run still has its fault.
			n = f.NodeFor(ctx, RoleBindingsLeader)
			fault.Target += " (none: bindings-leader)"
		}
		if n < 0 {
			f.t.Fatalf("chaos: no node holds %s", role)
		}
		if !seen[n] {
			seen[n] = true
			fault.Nodes = append(fault.Nodes, n)
			for _, r := range f.RolesOf(ctx, n) {
				if !slices.Contains(fault.Roles, r) {
					fault.Roles = append(fault.Roles, r)
				}
			}
		}
	}
	fault.At = rec.Now()
	for _, n := range fault.Nodes {
		f.Cluster.Stop(n)
	}
	sleep(ctx, down)
	fault.Back = rec.Now()
	for _, n := range fault.Nodes {
		f.Cluster.Start(n)
	}
	f.Cluster.WaitPeers(3)
	testutil.Eventually(f.t, 30*time.Second, func() bool {
		return f.Cluster.StreamLeader(BindingsStream) >= 0 && f.Cluster.StreamLeader(WorkersStream) >= 0
	}, func() string { return "buckets without a leader after " + fault.Target })
	fault.Recovered = rec.Now()
	return fault
}

// RestartReplica closes replica i (as a rolling restart would), keeps it
// down for down and starts a new one in its place (on the same node, with
// a new id).
func (f *Fleet) RestartReplica(ctx context.Context, rec *Recorder, i int, down time.Duration) Fault {
	f.t.Helper()
	fault := Fault{Target: fmt.Sprintf("replica %d", i)}
	f.mu.Lock()
	old := f.replicas[i]
	old.down = true
	f.drops = append(f.drops, time.Now())
	f.mu.Unlock()
	fault.At = rec.Now()
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	if err := old.r.Close(cctx); err != nil {
		f.t.Errorf("chaos: close replica %d: %v", i, err)
	}
	cancel()
	old.nc.Close()
	sleep(ctx, down)
	fault.Back = rec.Now()
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	rp, err := f.startReplica(sctx, i, old.gen+1)
	if err != nil {
		f.t.Fatalf("chaos: restart replica %d: %v", i, err)
	}
	f.mu.Lock()
	f.replicas[i] = rp
	f.mu.Unlock()
	fault.Recovered = rec.Now()
	return fault
}

// close stops workers and replicas, then closes every connection (the
// cluster's own cleanup stops the nodes).
func (f *Fleet) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if f.observer != nil {
		f.observer.Stop()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, reg := range f.regs {
		if reg != nil {
			reg.Stop()
		}
	}
	for _, rp := range f.replicas {
		if err := rp.r.Close(ctx); err != nil && !rp.down {
			f.t.Errorf("chaos: close replica: %v", err)
		}
	}
	for _, nc := range f.conns {
		nc.Close()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
