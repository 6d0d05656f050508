package workers

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
)

// testGrace is short so that the tests are quick, and long enough for a
// heartbeat (testHeartbeat) to re-create a vanished key well inside it on a
// loaded machine.
const testGrace = 2 * time.Second

func graceCfg() RegistryConfig {
	cfg := testCfg()
	cfg.DepartureGrace = testGrace
	return cfg
}

// A key that vanishes without a deregistration (a bare purge, as an expiry
// leaves) and comes back within the grace, as after a registry failover,
// has not departed: the worker is suspect (live, not available) meanwhile,
// then back.
func TestGraceKeyReturnsWithin(t *testing.T) {
	t.Parallel()
	_, js := setup(t)
	cfg := graceCfg()
	m, rec, reg := watchAndRegisterW1(t, js, cfg)
	kv, err := js.KeyValue(ctxT(t), DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctxT(t), KeyFor("w1")); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "suspect", "w1", time.Second)
	// The heartbeat re-creates the key within a heartbeat or two; the view
	// may already have seen it by now, so Live is what must hold.
	if !m.Live("w1") {
		t.Fatal("suspect worker not live")
	}
	back := rec.wait(t, "update", "w1", 2*testHeartbeat+slack)
	if back.info.Epoch != 42 || !m.Available("w1") || m.Suspect("w1") {
		t.Fatalf("after the key came back: %v available=%v suspect=%v", back, m.Available("w1"), m.Suspect("w1"))
	}
	rec.none(t, "depart", "w1", testGrace+slack)
	st := m.Stats()
	if st.Departs != 0 || st.Suspected != 1 || st.Returned != 1 || st.Suspect != 0 || reg.Stats().Recreated != 1 {
		t.Fatalf("stats: view %+v, registration %+v", st, reg.Stats())
	}
}

// While a worker is suspect, the view answers Live true, Available false
// and Suspect true; once the grace passes without the key, the departure
// is confirmed (OnDepart) and Live turns false.
func TestGraceKeyDoesNotReturn(t *testing.T) {
	t.Parallel()
	_, js := setup(t)
	cfg := graceCfg()
	m, rec, reg := watchAndRegisterW1(t, js, cfg)
	reg.Stop() // the key expires within TTL, as after a crash
	rec.wait(t, "suspect", "w1", testTTL+slack)
	if !m.Live("w1") || m.Available("w1") || !m.Suspect("w1") || m.Stats().Suspect != 1 {
		t.Fatalf("suspect: live=%v available=%v suspect=%v stats %+v", m.Live("w1"), m.Available("w1"), m.Suspect("w1"), m.Stats())
	}
	if _, ok := m.Get("w1"); !ok || m.Len() != 1 {
		t.Fatal("suspect worker missing from Get/Len")
	}
	rec.wait(t, "depart", "w1", testGrace+slack)
	if m.Live("w1") || m.Suspect("w1") || m.Len() != 0 {
		t.Fatalf("after the grace: live=%v suspect=%v len=%d", m.Live("w1"), m.Suspect("w1"), m.Len())
	}
	if st := m.Stats(); st.Departs != 1 || st.Returned != 0 || st.Suspect != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Explicit departures are confirmed at once, without a suspect phase:
// Deregister, and a KV delete.
func TestGraceExplicitDepartures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		drop func(t *testing.T, reg *Registration)
	}{
		{"deregister", func(t *testing.T, reg *Registration) {
			if err := reg.Deregister(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		}},
		{"kv delete", func(t *testing.T, reg *Registration) {
			reg.Stop()
			if err := reg.kv.Delete(ctxT(t), reg.Key()); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, js := setup(t)
			m, rec, reg := watchAndRegisterW1(t, js, graceCfg())
			tc.drop(t, reg)
			rec.wait(t, "depart", "w1", time.Second) // well inside the grace
			if m.Live("w1") || m.Stats().Suspected != 0 {
				t.Fatalf("live=%v stats %+v; events %v", m.Live("w1"), m.Stats(), rec.all())
			}
		})
	}
}

// A new epoch under the same id within the grace is a restart that lost
// its cache: OnDepart(old) and OnJoin(new) at once, as without a grace.
func TestGraceNewEpochWithin(t *testing.T) {
	t.Parallel()
	_, js := setup(t)
	cfg := graceCfg()
	m, rec, reg := watchAndRegisterW1(t, js, cfg)
	reg.Stop()
	rec.wait(t, "suspect", "w1", testTTL+slack)
	in := validInfo("w1")
	in.Epoch = 43
	register(t, js, cfg, in)
	d := rec.wait(t, "depart", "w1", time.Second)
	j := rec.wait(t, "join", "w1", time.Second)
	if d.info.Epoch != 42 || j.info.Epoch != 43 {
		t.Fatalf("restart within the grace: depart %v, join %v", d, j)
	}
	if ep, _ := m.Epoch("w1"); ep != 43 || !m.Available("w1") || m.Suspect("w1") {
		t.Fatalf("after restart: epoch %d available=%v suspect=%v", ep, m.Available("w1"), m.Suspect("w1"))
	}
	rec.none(t, "depart", "w1", testGrace+slack) // the old suspect timer is gone
}

// A drain deadline is a confirmed departure on every view at that time,
// even though the worker still heartbeats; its heartbeats do not bring it
// back, a new epoch does.
func TestDrainDeadlineDeparts(t *testing.T) {
	t.Parallel()
	_, js := setup(t)
	cfg := graceCfg()
	m, rec, reg := watchAndRegisterW1(t, js, cfg)
	deadline := time.Now().Add(time.Second)
	if err := reg.SetDrainingUntil(ctxT(t), deadline); err != nil {
		t.Fatal(err)
	}
	u := rec.wait(t, "update", "w1", time.Second)
	if u.info.State != StateDraining || !u.info.DrainDeadline.Equal(deadline.Round(0)) {
		t.Fatalf("draining update %+v, want deadline %v", u.info, deadline)
	}
	if !m.Live("w1") || m.Available("w1") {
		t.Fatal("draining worker must be live and not available")
	}
	d := rec.wait(t, "depart", "w1", time.Second+slack)
	if d.at.Before(deadline) {
		t.Fatalf("departed at %v, before the deadline %v", d.at, deadline)
	}
	if m.Live("w1") || m.Len() != 0 || len(m.Workers()) != 0 || m.Stats().DrainExpired != 1 {
		t.Fatalf("after the deadline: live=%v len=%d stats %+v", m.Live("w1"), m.Len(), m.Stats())
	}
	rec.none(t, "join", "w1", 3*testHeartbeat) // heartbeats keep the key, not the membership
	if err := reg.SetDrainingUntil(ctxT(t), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rec.none(t, "join", "w1", 2*testHeartbeat) // nor does a new value of the same epoch

	tcfg := cfg
	tcfg.TakeOver = true
	in := validInfo("w1")
	in.Epoch = 43
	register(t, js, tcfg, in)
	if j := rec.wait(t, "join", "w1", time.Second); j.info.Epoch != 43 {
		t.Fatalf("join %v, want epoch 43", j)
	}
	if !m.Available("w1") || m.Len() != 1 {
		t.Fatal("new epoch not available")
	}
}

// Drain writes its deadline (Grace + MaxWait from the start) into the
// registry, and routers depart the worker at it; the worker deregisters at
// the same time if its requests never finish.
func TestDrainWritesDeadline(t *testing.T) {
	t.Parallel()
	_, js := setup(t)
	m, rec, reg := watchAndRegisterW1(t, js, graceCfg())
	var busy atomic.Bool
	busy.Store(true)
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- reg.Drain(context.Background(), DrainConfig{Grace: -1, MaxWait: 800 * time.Millisecond, InFlight: func() int {
			if busy.Load() {
				return 1
			}
			return 0
		}})
	}()
	u := rec.wait(t, "update", "w1", time.Second)
	dl := u.info.DrainDeadline
	if u.info.State != StateDraining || dl.Before(start.Add(800*time.Millisecond)) || dl.After(time.Now().Add(800*time.Millisecond)) {
		t.Fatalf("draining info %+v: deadline not start+MaxWait (start %v)", u.info, start)
	}
	rec.wait(t, "depart", "w1", 800*time.Millisecond+slack)
	if err := <-done; err == nil {
		t.Fatal("Drain with requests in flight past MaxWait returned nil")
	}
	testutil.Eventually(t, time.Second, func() bool { return !m.Live("w1") }, func() string { return fmt.Sprint(m.Stats()) })
}
