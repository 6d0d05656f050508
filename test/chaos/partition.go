package chaos

import (
	"context"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
)

// Split is one network partition of the fault test's nemesis; every node
// keeps running through it (FleetConfig.Partitions).
type Split string

const (
	// IsolateBindingsLeader cuts the bindings stream's leader off from
	// both other nodes, both ways, and kills the workers connected to it;
	// the replica on it stays connected to it, the majority elects a new
	// leader, sees the workers depart and re-binds their Hard sessions.
	IsolateBindingsLeader Split = "isolate bindings-leader"
	// IsolateFollower puts a node that hosts a replica but not the
	// bindings leader in the minority.
	IsolateFollower Split = "isolate a follower"
	// OneWayFromLeader stalls everything the bindings leader sends to the
	// others; what they send still reaches it.
	OneWayFromLeader Split = "one way from bindings-leader"
	// OneWayToLeader stalls everything the others send to the bindings
	// leader; what it sends still reaches them.
	OneWayToLeader Split = "one way to bindings-leader"
	// FlapLeaderLink cuts and heals the link between the bindings leader
	// and one follower every flapPeriod.
	FlapLeaderLink Split = "flap bindings-leader link"
	// CutReplica cuts one replica (the one on the bindings leader's node)
	// off from NATS while every node runs: its clients still reach it.
	CutReplica Split = "cut a replica's NATS links"
)

const flapPeriod = 300 * time.Millisecond

// Partition applies split, keeps it for down (flapping meanwhile, for
// FlapLeaderLink), heals the network and waits until the cluster has
// recovered.
func (f *Fleet) Partition(ctx context.Context, rec *Recorder, split Split, down time.Duration) Fault {
	f.t.Helper()
	fault := Fault{Target: string(split)}
	leader := -1
	testutil.Eventually(f.t, 30*time.Second, func() bool {
		leader = f.NodeFor(ctx, RoleBindingsLeader)
		return leader >= 0
	}, func() string { return "no bindings leader for " + string(split) })
	node := leader
	if split == IsolateFollower {
		node = (leader + 1) % len(f.Cluster.Servers)
	}
	fault.Nodes = []int{node}
	fault.Roles = f.RolesOf(ctx, node)
	fault.At = rec.Now()
	f.mu.Lock()
	f.cuts = append(f.cuts, window{from: time.Now()})
	f.mu.Unlock()
	var killed []int
	switch split {
	case IsolateBindingsLeader:
		f.Cluster.Isolate(node)
		killed = f.KillWorkersOn(rec, node)
	case IsolateFollower:
		f.Cluster.Isolate(node)
	case OneWayFromLeader, OneWayToLeader:
		for j := range f.Cluster.Servers {
			if j == leader {
				continue
			}
			if split == OneWayFromLeader {
				f.Cluster.CutRoute(leader, j)
			} else {
				f.Cluster.CutRoute(j, leader)
			}
		}
	case FlapLeaderLink:
		f.flap(ctx, leader, (leader+1)%len(f.Cluster.Servers), down)
	case CutReplica:
		f.cutReplicaOn(leader)
	default:
		f.t.Fatalf("chaos: unknown split %q", split)
	}
	if split != FlapLeaderLink {
		sleep(ctx, down)
	}
	fault.Back = rec.Now()
	f.heal()
	f.mu.Lock()
	f.cuts[len(f.cuts)-1].to = time.Now()
	f.mu.Unlock()
	f.Cluster.WaitPeers(3)
	testutil.Eventually(f.t, 60*time.Second, func() bool {
		return f.Cluster.StreamLeader(BindingsStream) >= 0 && f.Cluster.StreamLeader(WorkersStream) >= 0
	}, func() string { return "buckets without a leader after " + string(split) })
	f.RestartWorkers(ctx, killed)
	fault.Recovered = rec.Now()
	return fault
}

// flap cuts and heals the route between a and b every flapPeriod for d.
func (f *Fleet) flap(ctx context.Context, a, b int, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		f.Cluster.CutRoute(a, b)
		f.Cluster.CutRoute(b, a)
		sleep(ctx, flapPeriod)
		f.heal()
		sleep(ctx, flapPeriod)
	}
}

// cutReplicaOn cuts every client link of the replicas connected to node.
func (f *Fleet) cutReplicaOn(node int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, rp := range f.replicas {
		if rp.node != node {
			continue
		}
		for _, l := range rp.links {
			l.Cut()
		}
	}
}

// heal heals every cut and records when: what a cut link held is
// delivered from then on (lastHealBetween).
func (f *Fleet) heal() {
	f.Cluster.Heal()
	f.mu.Lock()
	f.heals = append(f.heals, time.Now())
	f.mu.Unlock()
}

// lastHealBetween is the latest heal between from and to (zero: none). A
// cut link holds what it has read and delivers it at the heal, as TCP
// retransmits over a healed network: a NATS request sent during a cut may
// reach a replica only then, and its deadline_ms runs from its arrival.
func (f *Fleet) lastHealBetween(from, to time.Time) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last time.Time
	for _, h := range f.heals {
		if !h.Before(from) && !h.After(to) {
			last = h
		}
	}
	return last
}

// window is a time span; to is zero while it lasts.
type window struct{ from, to time.Time }

// partitionBetween reports whether the network was partitioned at any time
// between from and to: a NATS request sent then may have crossed a cut
// link, and NATS request-reply is at most once.
func (f *Fleet) partitionBetween(from, to time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.cuts {
		if !w.from.After(to) && (w.to.IsZero() || !w.to.Before(from)) {
			return true
		}
	}
	return false
}
