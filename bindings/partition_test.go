package bindings

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/session"
)

// A Hard binding read through a stream leader cut off from its peers is
// never the stale one: the majority elects a new leader, ends the session
// and binds it again elsewhere, and the replica connected to the old
// leader answers ErrUnavailable (or the new binding), never the old one.
// Also a Soft read there stays within MaxStaleness: the cut-off replica's
// cache cannot show it is fresh, so it reads from the leader too.
//
// Fails without the quorum rule (quorum.go): the old leader answers
// STREAM.MSG.GET and STREAM.INFO from its own state for seconds.
func TestPartitionedLeaderServesNoStaleRead(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster and waits for an election")
	}
	c := natstest.StartCluster(t, 3, natstest.Partitionable())
	// Any node works for the set-up; the bucket's leader is found after.
	_, js0 := natstest.JetStream(t, c.Servers[0])
	setup := openOn(t, js0, nil, Config{Replicas: 3, DefaultMode: session.Hard})
	mustRoute(t, setup, model, "hard", always("w1"))
	if _, err := setup.RouteMode(ctxT(t, 10*time.Second), model, "soft", session.Soft, always("w1")); err != nil {
		t.Fatal(err)
	}

	leader := c.StreamLeader("KV_" + DefaultBucket)
	other := (leader + 1) % 3
	// The replica under test talks only to the leader's node, through a
	// client link, and never fails over.
	cut := connectOnly(t, c.ClientLink(leader).Addr())
	jsCut, _ := jetstream.New(cut)
	onLeader := openOn(t, jsCut, cut, Config{Replicas: 3, OpTimeout: 2 * time.Second, ResolveTimeout: 2 * time.Second})
	_, jsOther := c.ConnectFrom(t, other)
	majority := openOn(t, jsOther, nil, Config{Replicas: 3, OpTimeout: 2 * time.Second})
	testutil.Eventually(t, 10*time.Second, func() bool { return onLeader.Stats().CacheFresh },
		func() string { return "the replica's cache never became fresh" })

	c.Isolate(leader)
	// The majority elects a new leader and moves both sessions to w2.
	var endErr, routeErr error // the last attempt's, for the failure message
	testutil.Eventually(t, 60*time.Second, func() bool {
		if endErr = majority.End(ctxT(t, 2*time.Second), model, "hard"); endErr != nil && !errors.Is(endErr, ErrNotFound) {
			return false
		}
		_, routeErr = majority.Route(ctxT(t, 2*time.Second), model, "hard", always("w2"))
		return routeErr == nil
	}, func() string {
		return fmt.Sprintf("the majority never re-bound the Hard session (last End: %v; last Route: %v; stats %+v)",
			endErr, routeErr, majority.Stats())
	})
	moved := time.Now()
	testutil.Eventually(t, 10*time.Second, func() bool {
		r, err := majority.Route(ctxT(t, 2*time.Second), model, "soft", always("w2"))
		return err == nil && r.Target.Worker == "w2"
	}, func() string { return "the majority never re-bound the Soft session" })

	// Reads through the old leader while it is cut off, for 3 s: none may
	// name w1 for the Hard session; the Soft one may only within
	// MaxStaleness of the move.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		start := time.Now()
		if b, err := onLeader.Get(ctxT(t, time.Second), model, "hard"); err == nil && b.Target.Worker == "w1" {
			t.Fatalf("stale Hard read through the cut-off leader: %+v (stats %+v)", b, onLeader.Stats())
		} else if err != nil && !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Hard read through the cut-off leader: %v, want ErrUnavailable or w2", err)
		}
		if b, err := onLeader.Get(ctxT(t, time.Second), model, "soft"); err == nil && b.Target.Worker == "w1" &&
			start.Sub(moved) > onLeader.Config().MaxStaleness {
			t.Fatalf("Soft read %v after the move still names w1 (bound %v)", start.Sub(moved), onLeader.Config().MaxStaleness)
		}
	}
	st := onLeader.Stats()
	t.Logf("through the cut-off leader: confirms %d, timeouts %d, mismatches %d, probe errors %d",
		st.Confirms, st.ConfirmTimeouts, st.ConfirmMismatches, st.ProbeErrors)

	c.Heal()
	testutil.Eventually(t, 60*time.Second, func() bool {
		b, err := onLeader.Get(ctxT(t, time.Second), model, "hard")
		return err == nil && b.Target.Worker == "w2"
	}, func() string { return "after the heal the replica never read the new binding" })
}

// connectOnly connects to one address and never to another node.
func connectOnly(t *testing.T, addr string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.DontRandomize(), nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatalf("connect %s: %v", addr, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
