package bindings

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/natstest"
)

// connectCluster connects to the cluster preferring node first, so that
// replicas sit on different nodes.
func connectCluster(t testing.TB, c *natstest.Cluster, first int) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	var urls []string
	for i := range c.Servers {
		urls = append(urls, c.Servers[(first+i)%len(c.Servers)].ClientURL())
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Kill the stream leader of a 3-node cluster (R3 bucket) while two replicas
// commit: new sessions enter all the time (racing creates) and live ones
// pass half their idle TTL (renewals). No session is routed to two workers,
// no live binding is lost, and every unanswered write is resolved.
func TestClusterLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster with leader kills takes ~15 s")
	}
	c := natstest.StartCluster(t, 3)
	const idle = 4 * time.Second
	cfg := Config{Replicas: 3, IdleTTL: idle, MarkerTTL: time.Second, OpTimeout: 400 * time.Millisecond,
		ResolveTimeout: 15 * time.Second, MaxAttempts: 8}
	var tables []*Table
	for i, id := range []string{"a", "b"} {
		nc, js := connectCluster(t, c, i)
		cc := cfg
		cc.ReplicaID = id
		tables = append(tables, openOn(t, js, nc, cc))
	}
	stream := "KV_" + DefaultBucket
	waitFor(t, 10*time.Second, "a stream leader", func() bool { return c.StreamLeader(stream) >= 0 })

	// Session s is in use from s*step for window*step: a new session every
	// step, each used for 4 s (so it is renewed once past 2 s).
	const step, window = 20 * time.Millisecond, 200
	type last struct {
		worker string
		at     time.Time
	}
	var (
		mu     sync.Mutex
		routes int
		seen   = map[string]map[string]int{} // session -> worker -> routes
		lastOK = map[string]time.Time{}
		errs   = map[string]int{}
		failed []error
	)
	t0 := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ti, tb := range tables {
		sel := pick(fmt.Sprintf("w%d", ti), fmt.Sprintf("w%d", ti+2))
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					base := int(time.Since(t0) / step)
					session := fmt.Sprintf("s%d", base+rand.IntN(window))
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					res, err := tb.Route(ctx, model, session, sel)
					cancel()
					now := time.Now()
					mu.Lock()
					if err != nil {
						switch {
						case errors.Is(err, ErrAmbiguous), errors.Is(err, ErrTooManyConflicts), errors.Is(err, context.DeadlineExceeded),
							strings.Contains(err.Error(), "leader read"):
							errs[errClass(err)]++
						default:
							failed = append(failed, err)
						}
					} else {
						routes++
						if seen[session] == nil {
							seen[session] = map[string]int{}
						}
						seen[session][res.Target.Worker]++
						lastOK[session] = now
					}
					mu.Unlock()
				}
			}()
		}
	}

	for round := 0; round < 2; round++ {
		time.Sleep(1500 * time.Millisecond)
		leader := c.StreamLeader(stream)
		if leader < 0 {
			t.Fatalf("round %d: no stream leader", round)
		}
		mu.Lock()
		before := routes
		mu.Unlock()
		t.Logf("round %d: killing stream leader n%d after %d successful routes", round, leader, before)
		c.Servers[leader].Shutdown()
		time.Sleep(1000 * time.Millisecond)
		c.Restart(leader)
		waitFor(t, 10*time.Second, "a stream leader after restart", func() bool { return c.StreamLeader(stream) >= 0 })
	}
	time.Sleep(1000 * time.Millisecond)
	close(stop)
	wg.Wait()
	checkAt := time.Now()

	for _, err := range failed {
		t.Errorf("unexpected Route error: %v", err)
	}
	checked := 0
	for session, workers := range seen {
		if len(workers) != 1 {
			t.Errorf("session %s routed to several workers: %v", session, workers)
		}
		// A binding routed to less than idle/2 ago must still be there.
		if checkAt.Sub(lastOK[session]) > idle/2-200*time.Millisecond {
			continue
		}
		checked++
		st := leaderGet(t, tables[0], model, session)
		if !st.present || st.bad != nil {
			t.Errorf("session %s: binding lost %v after its last route (%+v)", session, checkAt.Sub(lastOK[session]), st)
			continue
		}
		if st.rec.Version != 1 {
			t.Errorf("session %s: re-bound (version %d) although every worker was live", session, st.rec.Version)
		}
		if workers[st.rec.Worker] == 0 {
			t.Errorf("session %s bound to %s but routed to %v", session, st.rec.Worker, workers)
		}
	}
	var sum Stats
	for _, tb := range tables {
		s := tb.Stats()
		sum.Created += s.Created
		sum.Renewed += s.Renewed
		sum.Conflicts += s.Conflicts
		sum.Ambiguous += s.Ambiguous
		sum.AmbiguousLanded += s.AmbiguousLanded
		sum.Unresolved += s.Unresolved
		t.Logf("replica %s: %+v", tb.cfg.ReplicaID, s)
	}
	t.Logf("%d successful routes over %d sessions (%d checked live); tolerated errors %v; created %d, renewed %d, conflicts %d; ambiguous writes %d (landed %d, unresolved %d)",
		routes, len(seen), checked, errs, sum.Created, sum.Renewed, sum.Conflicts, sum.Ambiguous, sum.AmbiguousLanded, sum.Unresolved)
	if sum.Unresolved != 0 {
		t.Errorf("%d ambiguous writes unresolved", sum.Unresolved)
	}
	if sum.Created < 100 || sum.Renewed == 0 || checked < 50 {
		t.Errorf("too little commit traffic: created %d, renewed %d, checked %d", sum.Created, sum.Renewed, checked)
	}
}

func errClass(err error) string {
	switch {
	case errors.Is(err, ErrAmbiguous):
		return "ambiguous"
	case errors.Is(err, ErrTooManyConflicts):
		return "too-many-conflicts"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return "leader-read"
}
