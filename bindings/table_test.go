package bindings

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/jskv"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

const model = "llama"

// Replicas race the first request of many sessions (Hard): every session
// ends bound to exactly one worker and every request was routed there.
func TestReplicasRaceFirstRequests(t *testing.T) {
	e := newEnv(t)
	const replicas, sessions, perReplica = 3, 40, 3
	tables := make([]*Table, replicas)
	for i := range tables {
		tables[i] = e.open(Config{ReplicaID: fmt.Sprintf("r%d", i)})
	}
	type routed struct {
		session string
		target  workerref.Target
	}
	var (
		mu   sync.Mutex
		got  []routed
		errs []error
		wg   sync.WaitGroup
	)
	start := make(chan struct{})
	for r, tb := range tables {
		// Each replica prefers different workers, so racing creators
		// disagree.
		sel := pick(fmt.Sprintf("w%d", r), fmt.Sprintf("w%d", r+1), "w9")
		for s := 0; s < sessions; s++ {
			for k := 0; k < perReplica; k++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					session := fmt.Sprintf("sess-%d", s)
					res, err := tb.Route(context.Background(), model, session, sel)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
						return
					}
					got = append(got, routed{session, res.Target})
				}()
			}
		}
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		t.Errorf("Route: %v", err)
	}
	if len(got) != replicas*sessions*perReplica {
		t.Fatalf("%d results, want %d", len(got), replicas*sessions*perReplica)
	}
	bound := map[string]string{}
	for s := 0; s < sessions; s++ {
		session := fmt.Sprintf("sess-%d", s)
		st := leaderGet(t, tables[0], model, session)
		if !st.present || st.rec.Version != 1 {
			t.Fatalf("session %s: state %+v", session, st)
		}
		bound[session] = st.rec.Worker
	}
	for _, g := range got {
		if g.target.Worker != bound[g.session] {
			t.Errorf("session %s routed to %s, bound to %s", g.session, g.target.Worker, bound[g.session])
		}
	}
	var created, waits, conflicts uint64
	for _, tb := range tables {
		st := tb.Stats()
		created += st.Created
		waits += st.Waits
		conflicts += st.Conflicts
		if st.Rebound != 0 || st.Rejected != 0 || st.KeptOther != 0 {
			t.Errorf("unexpected outcomes: %+v", st)
		}
	}
	if created != sessions {
		t.Errorf("created %d bindings, want %d", created, sessions)
	}
	t.Logf("created %d, waits %d, conflicts %d", created, waits, conflicts)
}

// Concurrent first requests of one session in one replica wait for the
// creator: selection runs once for the unbound session, one write.
func TestSingleFlightFirstRequests(t *testing.T) {
	tb := newEnv(t).open(Config{})
	var unbound atomic.Int32
	release := make(chan struct{})
	sel := func(_ context.Context, req *Requirement) (workerref.Target, error) {
		if req != nil {
			return req.Target, nil
		}
		unbound.Add(1)
		<-release // the creator selects until every other request waits for it
		return workerref.Any("w1"), nil
	}
	const n = 10
	var wg sync.WaitGroup
	outcomes := make([]Outcome, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := tb.Route(context.Background(), model, "one", sel)
			if err != nil {
				t.Error(err)
			}
			outcomes[i] = res.Outcome
		}()
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return tb.Stats().Waits == n-1 },
		func() string { return fmt.Sprintf("not every other request waits for the creator: %+v", tb.Stats()) })
	close(release)
	wg.Wait()
	st := tb.Stats()
	if unbound.Load() != 1 || st.Created != 1 || st.Fresh != n-1 || st.Writes != 1 || st.Waits != n-1 {
		t.Fatalf("unbound selections %d, stats %+v, outcomes %v", unbound.Load(), st, outcomes)
	}
}

// A busy session performs no KV write per request: revision and write count
// stay put while the binding is fresh. A Soft one is read from the cache,
// a Hard one from the leader on every request.
func TestBusySessionDoesNotWrite(t *testing.T) {
	for _, mode := range []session.Mode{session.Soft, session.Hard} {
		t.Run(mode.String(), func(t *testing.T) { testBusySession(t, mode) })
	}
}

func testBusySession(t *testing.T, mode session.Mode) {
	e := newEnv(t)
	a := e.open(Config{ReplicaID: "a", DefaultMode: mode})
	b := e.open(Config{ReplicaID: "b", DefaultMode: mode})
	first := mustRoute(t, a, model, "busy", always("w1"))
	if first.Outcome != Created {
		t.Fatalf("first outcome %v", first.Outcome)
	}
	// b learns the binding from its watch.
	testutil.Eventually(t, 5*time.Second, func() bool {
		kb, _ := Key(model, "busy")
		st, ok := b.cache.getString(kb)
		return ok && st.present
	}, func() string { return "still waiting for b's cache to see the binding" })
	wa, wb := a.Stats().Writes, b.Stats().Writes
	lr := b.Stats().LeaderReads
	for i := 0; i < 200; i++ {
		tb := a
		if i%2 == 1 {
			tb = b
		}
		res := mustRoute(t, tb, model, "busy", pick("w2"))
		if res.Outcome != Fresh || res.Target.Worker != "w1" || res.Binding.Revision != first.Binding.Revision {
			t.Fatalf("request %d: %+v", i, res)
		}
	}
	if a.Stats().Writes != wa || b.Stats().Writes != wb {
		t.Fatalf("writes changed: a %d -> %d, b %d -> %d", wa, a.Stats().Writes, wb, b.Stats().Writes)
	}
	wantReads := lr // Soft: the cache answers
	if mode == session.Hard {
		wantReads += 100 // b's requests
	}
	if got := b.Stats().LeaderReads; got != wantReads {
		t.Fatalf("%s: b made %d leader reads, want %d", mode, got-lr, wantReads-lr)
	}
	if n := b.Stats().DirectFallbacks; n != 0 {
		t.Fatalf("%s: %d leader reads of a stored binding fell back from the direct get", mode, n)
	}
	if st := leaderGet(t, a, model, "busy"); st.rev != first.Binding.Revision {
		t.Fatalf("revision moved from %d to %d", first.Binding.Revision, st.rev)
	}
}

// Renewal keeps the TTL: a renewed binding outlives its first expiry and
// then, idle, still expires. An idle binding expires and the session can be
// bound again.
func TestRenewalAndIdleExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for 2 s TTLs")
	}
	t.Parallel()
	tb := newEnv(t).open(Config{IdleTTL: 2 * time.Second, MarkerTTL: time.Second})
	t0 := time.Now()
	c1 := mustRoute(t, tb, model, "renewed", always("w1"))
	c2 := mustRoute(t, tb, model, "idle", always("w1"))
	if c1.Outcome != Created || c2.Outcome != Created {
		t.Fatalf("outcomes %v %v", c1.Outcome, c2.Outcome)
	}
	// Before half the TTL: fresh, no write.
	if r := mustRoute(t, tb, model, "renewed", pick("w2")); r.Outcome != Fresh {
		t.Fatalf("at %v: %v", time.Since(t0), r.Outcome)
	}
	time.Sleep(time.Until(t0.Add(1200 * time.Millisecond)))
	r := mustRoute(t, tb, model, "renewed", pick("w2"))
	if r.Outcome != Renewed || r.Binding.Revision == c1.Binding.Revision || r.Binding.Version != 1 || r.Target.Worker != "w1" {
		t.Fatalf("renewal: %+v", r)
	}
	renewedAt := time.Now()
	// Past the first expiry: the idle one is gone, the renewed one lives.
	testutil.Eventually(t, 5*time.Second, func() bool { return !leaderGet(t, tb, model, "idle").present },
		func() string { return fmt.Sprintf("idle binding still present at %v", time.Since(t0)) })
	if idle := time.Since(t0); idle < 1900*time.Millisecond {
		t.Fatalf("idle binding expired after %v (TTL 2 s)", idle)
	}
	if st := leaderGet(t, tb, model, "renewed"); !st.present || st.rev != r.Binding.Revision {
		t.Fatalf("renewed binding gone at %v: %+v", time.Since(t0), st)
	}
	testutil.Eventually(t, 2*time.Second, func() bool {
		_, err := tb.Get(context.Background(), model, "idle")
		return errors.Is(err, ErrNotFound)
	}, func() string { return "still waiting for the cache to drop the idle binding" })
	// The renewal carried a TTL: idle now, it expires too.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return !leaderGet(t, tb, model, "renewed").present
	}, func() string { return "still waiting for the renewed binding to expire" })
	if idle := time.Since(renewedAt); idle < 1900*time.Millisecond {
		t.Fatalf("renewed binding expired after %v idle", idle)
	}
	// An expired session binds afresh (over the expiry marker).
	if r := mustRoute(t, tb, model, "idle", always("w3")); r.Outcome != Created || r.Target.Worker != "w3" {
		t.Fatalf("re-create after expiry: %+v", r)
	}
}

// On a one-replica stream a leader read is a direct get; only what it
// cannot show (an absence, which a mirror could give too) goes to
// STREAM.MSG.GET as well, and both agree with the stored state.
func TestOneReplicaLeaderReadsAreDirect(t *testing.T) {
	e := newEnv(t)
	a := e.open(Config{ReplicaID: "a", DefaultMode: session.Hard})
	if a.directGetPre == "" {
		t.Fatal("no direct reads on a one-replica bucket")
	}
	r := mustRoute(t, a, model, "s", always("w1"))
	st := leaderGet(t, a, model, "s")
	if !st.present || st.rev != r.Binding.Revision || st.rec.Worker != "w1" || a.Stats().DirectFallbacks != 0 {
		t.Fatalf("leader read %+v (revision want %d), stats %+v", st, r.Binding.Revision, a.Stats())
	}
	if _, err := a.Get(ctxT(t, 5*time.Second), model, "none"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of an absent session: %v", err)
	}
	if n := a.Stats().DirectFallbacks; n != 1 {
		t.Fatalf("absence: %d fallbacks to STREAM.MSG.GET, want 1", n)
	}
	if err := a.End(ctxT(t, 5*time.Second), model, "s"); err != nil {
		t.Fatal(err)
	}
	if st := leaderGet(t, a, model, "s"); st.present || st.rev <= r.Binding.Revision || a.Stats().DirectFallbacks != 1 {
		t.Fatalf("after End: %+v, stats %+v; want the purge marker, read directly", st, a.Stats())
	}
}

func TestHardDepartedWorkerRebinds(t *testing.T) {
	live := &liveSet{}
	tb := newEnv(t).open(Config{Liveness: live})
	c := mustRoute(t, tb, model, "s", always("w1"))
	live.depart("w1")
	var seen *Requirement
	sel := func(_ context.Context, req *Requirement) (workerref.Target, error) {
		cp := *req
		seen = &cp
		return workerref.Of("w2", 1), nil
	}
	r := mustRoute(t, tb, model, "s", sel)
	if seen == nil || seen.Target.Worker != "w1" || seen.Mode != session.Hard {
		t.Fatalf("requirement %+v", seen)
	}
	if r.Outcome != Rebound || r.Target.Worker != "w2" || r.Binding.Version != 2 || r.Binding.Mode != session.Hard || r.Binding.AnyRank || r.Binding.Rank != 1 {
		t.Fatalf("rebind: %+v", r)
	}
	st := leaderGet(t, tb, model, "s")
	if st.rec.Worker != "w2" || st.rev <= c.Binding.Revision {
		t.Fatalf("stored %+v", st.rec)
	}
}

func TestHardLiveWorkerRejects(t *testing.T) {
	tb := newEnv(t).open(Config{Liveness: &liveSet{}})
	c := mustRoute(t, tb, model, "s", always("w1"))
	r, err := tb.Route(context.Background(), model, "s", always("w2"))
	if !errors.Is(err, ErrHardBindingConflict) {
		t.Fatalf("err %v", err)
	}
	var hc *HardConflictError
	if !errors.As(err, &hc) || hc.Bound.Worker != "w1" || hc.Selected.Worker != "w2" || hc.Session != "s" {
		t.Fatalf("error %#v", err)
	}
	if !strings.Contains(err.Error(), `"w1"`) || !strings.Contains(err.Error(), `"s"`) {
		t.Fatalf("error text %q does not name the session and worker", err)
	}
	if r.Outcome != Rejected || r.Binding.Worker != "w1" {
		t.Fatalf("result %+v", r)
	}
	st := leaderGet(t, tb, model, "s")
	if st.rev != c.Binding.Revision || st.rec.Worker != "w1" {
		t.Fatalf("binding changed: %+v", st)
	}
	if s := tb.Stats(); s.Rejected != 1 || s.Writes != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A replica whose cache lags a re-bind made elsewhere (the other replica saw
// the worker depart) does not act on its stale view: a cached Hard binding
// is read from the leader first, so it selects under the new binding.
func TestHardRejectConfirmsOnLeader(t *testing.T) {
	e := newEnv(t)
	liveB := &liveSet{}
	a := e.open(Config{ReplicaID: "a", Liveness: &liveSet{}})
	b := e.open(Config{ReplicaID: "b", Liveness: liveB})
	mustRoute(t, a, model, "s", always("w1"))
	key, _ := Key(model, "s")
	var stale readState
	testutil.Eventually(t, 5*time.Second, func() bool {
		st, ok := b.cache.getString(key)
		stale = st
		return ok && st.present
	}, func() string { return "still waiting for b's watch" })
	liveB.depart("w1")
	if r := mustRoute(t, b, model, "s", always("w2")); r.Outcome != Rebound {
		t.Fatalf("b: %+v", r)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		st, ok := a.cache.getString(key)
		return ok && st.rec.Worker == "w2"
	}, func() string { return "still waiting for a's watch" })
	a.cache.mu.Lock()
	a.cache.m[key] = stale // a lags behind
	a.cache.mu.Unlock()
	r, err := a.Route(context.Background(), model, "s", always("w2"))
	if err != nil || r.Outcome != Fresh || r.Target.Worker != "w2" || r.Selections != 1 {
		t.Fatalf("a: %+v %v", r, err)
	}
}

func TestSoftRebind(t *testing.T) {
	tb := newEnv(t).open(Config{DefaultMode: session.Soft})
	c := mustRoute(t, tb, model, "s", always("w1"))
	if c.Binding.Mode != session.Soft {
		t.Fatalf("mode %v", c.Binding.Mode)
	}
	r := mustRoute(t, tb, model, "s", always("w2"))
	if r.Outcome != Rebound || r.Target.Worker != "w2" || r.Binding.Version != 2 || r.Binding.Mode != session.Soft {
		t.Fatalf("rebind %+v", r)
	}
	if st := leaderGet(t, tb, model, "s"); st.rec.Worker != "w2" {
		t.Fatalf("stored %+v", st.rec)
	}
}

// Soft: another writer re-binds between our read and our write; we keep
// theirs and the request still goes to our selection.
func TestSoftConflictKeepsOther(t *testing.T) {
	e := newEnv(t)
	a := e.open(Config{DefaultMode: session.Soft, ReplicaID: "a"})
	b := e.open(Config{DefaultMode: session.Soft, ReplicaID: "b"})
	mustRoute(t, a, model, "s", always("w1"))
	sel := func(ctx context.Context, req *Requirement) (workerref.Target, error) {
		if req == nil || req.Target.Worker != "w1" {
			t.Errorf("a's requirement %+v", req)
		}
		// b moves the binding first.
		if r := mustRoute(t, b, model, "s", always("w3")); r.Outcome != Rebound {
			t.Errorf("b: %+v", r)
		}
		return workerref.Any("w2"), nil
	}
	r := mustRoute(t, a, model, "s", sel)
	if r.Outcome != KeptOther || r.Target.Worker != "w2" || r.Binding.Worker != "w3" || r.Binding.Writer != "b" {
		t.Fatalf("result %+v", r)
	}
	if st := leaderGet(t, a, model, "s"); st.rec.Worker != "w3" {
		t.Fatalf("stored %+v", st.rec)
	}
	if s := a.Stats(); s.KeptOther != 1 || s.Conflicts != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Hard: a create that loses to another replica selects again under the
// winner's binding.
func TestCreateLostSelectsUnderWinner(t *testing.T) {
	e := newEnv(t)
	a := e.open(Config{ReplicaID: "a"})
	b := e.open(Config{ReplicaID: "b"})
	var reqs []*Requirement
	sel := func(ctx context.Context, req *Requirement) (workerref.Target, error) {
		if req == nil {
			reqs = append(reqs, nil)
			if r := mustRoute(t, b, model, "s", always("wb")); r.Outcome != Created {
				t.Errorf("b: %+v", r)
			}
			return workerref.Any("wa"), nil
		}
		cp := *req
		reqs = append(reqs, &cp)
		return req.Target, nil
	}
	r := mustRoute(t, a, model, "s", sel)
	if r.Target.Worker != "wb" || r.Outcome != Fresh || r.Selections != 2 {
		t.Fatalf("result %+v", r)
	}
	if len(reqs) != 2 || reqs[0] != nil || reqs[1].Target.Worker != "wb" || reqs[1].Mode != session.Hard {
		t.Fatalf("requirements %v", reqs)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	tb := e.open(Config{})
	ctx := ctxT(t, 10*time.Second)
	cases := []struct {
		name           string
		model, session string
		sel            Selector
		want           error
	}{
		{"empty session", model, "", always("w"), ErrInvalidSession},
		{"long session", model, strings.Repeat("s", MaxSessionLen+1), always("w"), ErrInvalidSession},
		{"long model", strings.Repeat("m", MaxModelLen+1), "s", always("w"), ErrInvalidModel},
		{"nil selector", model, "s", nil, ErrNilSelector},
		{"selector error", model, "s", func(context.Context, *Requirement) (workerref.Target, error) {
			return workerref.Target{}, context.DeadlineExceeded
		}, context.DeadlineExceeded},
		{"selector no worker", model, "s", func(context.Context, *Requirement) (workerref.Target, error) { return workerref.Target{}, nil }, ErrSelect},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := tb.Route(ctx, c.model, c.session, c.sel)
			if !errors.Is(err, c.want) {
				t.Fatalf("Route: %v, want %v", err, c.want)
			}
		})
	}
	if _, err := tb.Get(ctx, model, ""); !errors.Is(err, ErrInvalidSession) {
		t.Errorf("Get: %v", err)
	}
	if err := tb.End(ctx, model, strings.Repeat("s", 300)); !errors.Is(err, ErrInvalidSession) {
		t.Errorf("End: %v", err)
	}
	if s := tb.Stats(); s.BadInput != 5 || s.SelectErrors != 2 || s.Writes != 0 {
		t.Errorf("stats %+v", s)
	}
	// The longest session id works.
	long := strings.Repeat("\xff", MaxSessionLen)
	if r := mustRoute(t, tb, model, long, always("w")); r.Outcome != Created || r.Binding.Session != long {
		t.Errorf("longest session: %+v", r)
	}

	t.Run("unknown mode", func(t *testing.T) {
		nc, js := newEnvJS(e)
		if _, err := Open(ctx, js, nc, Config{DefaultMode: session.Mode(7)}); !errors.Is(err, session.ErrUnknownMode) {
			t.Fatalf("Open: %v", err)
		}
	})
	t.Run("bucket without per-key TTL", func(t *testing.T) {
		nc, js := newEnvJS(e)
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "plain", History: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(ctx, js, nc, Config{Bucket: "plain"}); !errors.Is(err, ErrBucketConfig) {
			t.Fatalf("Open: %v", err)
		}
	})
}

func newEnvJS(e *env) (*nats.Conn, jetstream.JetStream) {
	nc, err := nats.Connect(e.s.ClientURL())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	return nc, js
}

// A malformed stored value is reported, never overwritten; End removes it.
func TestMalformedValue(t *testing.T) {
	e := newEnv(t)
	tb := e.open(Config{})
	_, js := newEnvJS(e)
	ctx := ctxT(t, 10*time.Second)
	kv, err := js.KeyValue(ctx, DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{
		"garbage":      `not json`,
		"unknown-mode": `{"model":"llama","session":"unknown-mode","worker":"w","mode":"sticky","version":1,"nonce":"n"}`,
		"other-key":    `{"model":"llama","session":"someone-else","worker":"w","mode":"hard","version":1,"nonce":"n"}`,
	}
	for id, v := range values {
		t.Run(id, func(t *testing.T) {
			key, _ := Key(model, id)
			rev, err := kv.Put(ctx, key, []byte(v))
			if err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 5*time.Second, func() bool {
				st, ok := tb.cache.getString(key)
				return ok && st.rev == rev
			}, func() string { return "still waiting for watch delivery" })
			for i := 0; i < 2; i++ {
				_, err := tb.Route(ctx, model, id, always("w2"))
				var mv *MalformedValueError
				if !errors.Is(err, ErrMalformedValue) || !errors.As(err, &mv) || mv.Revision != rev || mv.Key != key {
					t.Fatalf("Route: %v", err)
				}
			}
			if id == "unknown-mode" {
				if _, err := tb.Get(ctx, model, id); !errors.Is(err, session.ErrUnknownMode) {
					t.Fatalf("Get: %v does not wrap ErrUnknownMode", err)
				}
			}
			e, err := kv.Get(ctx, key)
			if err != nil || string(e.Value()) != v || e.Revision() != rev {
				t.Fatalf("value was touched: %v %v", e, err)
			}
			if err := tb.End(ctx, model, id); err != nil {
				t.Fatalf("End: %v", err)
			}
			if r := mustRoute(t, tb, model, id, always("w2")); r.Outcome != Created {
				t.Fatalf("after End: %+v", r)
			}
		})
	}
	if s := tb.Stats(); s.Malformed < 7 {
		t.Errorf("malformed count %d", s.Malformed)
	}
}

func TestEnd(t *testing.T) {
	e := newEnv(t)
	a := e.open(Config{ReplicaID: "a"})
	b := e.open(Config{ReplicaID: "b"})
	ctx := ctxT(t, 10*time.Second)
	if err := a.End(ctx, model, "s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("End of unbound: %v", err)
	}
	mustRoute(t, a, model, "s", always("w1"))
	if err := b.End(ctx, model, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, model, "s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after End: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		_, err := a.Get(ctx, model, "s")
		return errors.Is(err, ErrNotFound)
	}, func() string { return "still waiting for a's watch to see the end" })
	if r := mustRoute(t, a, model, "s", always("w2")); r.Outcome != Created || r.Target.Worker != "w2" {
		t.Fatalf("after End: %+v", r)
	}
}

// A binding written by one replica reaches another's cache through the
// watch; the other then serves it without reading the leader.
func TestWatchFeedsOtherReplica(t *testing.T) {
	e := newEnv(t)
	a := e.open(Config{ReplicaID: "a", DefaultMode: session.Soft})
	b := e.open(Config{ReplicaID: "b", DefaultMode: session.Soft})
	mustRoute(t, a, model, "s", always("w1"))
	testutil.Eventually(t, 5*time.Second, func() bool {
		bd, err := b.Get(context.Background(), model, "s")
		return err == nil && bd.Worker == "w1" && bd.Writer == "a"
	}, func() string { return "still waiting for b's watch" })
	lr := b.Stats().LeaderReads
	if r := mustRoute(t, b, model, "s", pick("w2")); r.Outcome != Fresh || r.Target.Worker != "w1" {
		t.Fatalf("b: %+v", r)
	}
	if b.Stats().LeaderReads != lr {
		t.Fatal("b read the leader for a cached binding")
	}
	// A table opened later loads existing bindings before Open returns.
	c := e.open(Config{ReplicaID: "c"})
	if bd, err := c.Get(context.Background(), model, "s"); err != nil || bd.Worker != "w1" {
		t.Fatalf("c: %+v %v", bd, err)
	}
}

func TestStrictReads(t *testing.T) {
	e := newEnv(t)
	tb := e.open(Config{StrictReads: true})
	c := mustRoute(t, tb, model, "s", always("w1"))
	r := mustRoute(t, tb, model, "s", pick("w2"))
	if c.Outcome != Created || r.Outcome != Fresh || r.Target.Worker != "w1" {
		t.Fatalf("%v %+v", c.Outcome, r)
	}
	if s := tb.Stats(); s.LeaderReads != 2 || s.Writes != 1 || s.CacheHits != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Past CacheEntries the cache evicts and confirms misses on the leader; the
// answers stay right.
func TestBoundedCache(t *testing.T) {
	e := newEnv(t)
	tb := e.open(Config{CacheEntries: 4})
	for i := 0; i < 12; i++ {
		mustRoute(t, tb, model, fmt.Sprintf("s%d", i), always(fmt.Sprintf("w%d", i)))
	}
	s := tb.Stats()
	if s.CacheEntries > 4 || s.CacheEvictions == 0 || s.CacheComplete {
		t.Fatalf("stats %+v", s)
	}
	for i := 0; i < 12; i++ {
		r := mustRoute(t, tb, model, fmt.Sprintf("s%d", i), pick("x"))
		if r.Outcome != Fresh || r.Target.Worker != fmt.Sprintf("w%d", i) {
			t.Fatalf("s%d: %+v", i, r)
		}
	}
	if s := tb.Stats(); s.Writes != 12 {
		t.Fatalf("writes %d", s.Writes)
	}
}

// Unanswered writes are resolved by a leader read and the nonce.
func TestAmbiguousWrites(t *testing.T) {
	e := newEnv(t)
	timeout := fmt.Errorf("injected: %w", context.DeadlineExceeded)

	t.Run("landed", func(t *testing.T) {
		tb := e.open(Config{Bucket: "amb1"})
		real := tb.publish
		tb.publish = func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			if _, err := real(ctx, m, opts...); err != nil {
				return nil, err
			}
			return nil, timeout // the ack is lost
		}
		r := mustRoute(t, tb, model, "s", always("w1"))
		if r.Outcome != Created || r.Target.Worker != "w1" || r.Binding.Revision == 0 {
			t.Fatalf("%+v", r)
		}
		if s := tb.Stats(); s.Ambiguous != 1 || s.AmbiguousLanded != 1 || s.Writes != 1 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("not landed", func(t *testing.T) {
		tb := e.open(Config{Bucket: "amb2"})
		real := tb.publish
		var n atomic.Int32
		tb.publish = func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			if n.Add(1) == 1 {
				return nil, timeout // lost on the way
			}
			return real(ctx, m, opts...)
		}
		r := mustRoute(t, tb, model, "s", always("w1"))
		if r.Outcome != Created || r.Target.Worker != "w1" || r.Selections != 1 {
			t.Fatalf("%+v", r)
		}
		if s := tb.Stats(); s.Ambiguous != 1 || s.AmbiguousLanded != 0 || s.Writes != 2 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("landed late", func(t *testing.T) {
		// The first write is held back and only lands just before the
		// retry, which then loses to it: the value carries our first
		// nonce, so it is ours.
		tb := e.open(Config{Bucket: "amb3"})
		real := tb.publish
		var held *nats.Msg
		var heldOpts []jetstream.PublishOpt
		tb.publish = func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			if held == nil {
				held, heldOpts = m, opts
				return nil, timeout
			}
			late := &nats.Msg{Subject: held.Subject, Data: held.Data}
			if _, err := real(context.Background(), late, heldOpts...); err != nil {
				t.Errorf("late write: %v", err)
			}
			return real(ctx, m, opts...)
		}
		sel := func(_ context.Context, req *Requirement) (workerref.Target, error) {
			if req != nil {
				return req.Target, nil
			}
			return workerref.Any("w1"), nil
		}
		r := mustRoute(t, tb, model, "s", sel)
		if r.Outcome != Created || r.Target.Worker != "w1" {
			t.Fatalf("%+v", r)
		}
		if s := tb.Stats(); s.Ambiguous != 1 || s.AmbiguousLanded != 1 || s.Conflicts != 1 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("unresolved", func(t *testing.T) {
		tb := e.open(Config{Bucket: "amb4", ResolveTimeout: 200 * time.Millisecond})
		tb.publish = func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			return nil, timeout
		}
		tb.msgGetSubj = "$JS.API.STREAM.MSG.GET.NOBODY" // the leader cannot be asked
		tb.directGetPre = "$JS.API.DIRECT.GET.NOBODY."
		_, err := tb.Route(ctxT(t, 5*time.Second), model, "s", always("w1"))
		if !errors.Is(err, ErrAmbiguous) {
			t.Fatalf("Route: %v", err)
		}
		if s := tb.Stats(); s.Unresolved != 1 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// Conflict errors from raw publishes (10071, 10164) and the KV client's
// mapped errors all become ErrConflict; anything unanswered is ambiguous.
func TestClassifyWrite(t *testing.T) {
	for _, c := range []struct {
		name      string
		err       error
		conflict  bool
		ambiguous bool
	}{
		{"nil", nil, false, false},
		{"10071", &jetstream.APIError{Code: 400, ErrorCode: 10071}, true, false},
		{"10164", fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: 10164}), true, false},
		{"key exists", jetstream.ErrKeyExists, true, false},
		{"revision mismatch", jetstream.ErrKeyRevisionMismatch, true, false},
		{"ttl disabled", &jetstream.APIError{Code: 400, ErrorCode: 10166}, false, false},
		{"timeout", context.DeadlineExceeded, false, true},
		{"nats timeout", nats.ErrTimeout, false, true},
		{"no stream response", jetstream.ErrNoStreamResponse, false, true},
	} {
		err := classifyWrite(c.err)
		if errors.Is(err, ErrConflict) != c.conflict || isAmbiguous(err) != c.ambiguous {
			t.Errorf("%s: %v (conflict %v, ambiguous %v)", c.name, err, errors.Is(err, ErrConflict), isAmbiguous(err))
		}
		// The shared classification stays reachable, and the text is ours.
		if errors.Is(err, jskv.ErrConflict) != c.conflict {
			t.Errorf("%s: %v: matches jskv.ErrConflict %v, want %v", c.name, err, errors.Is(err, jskv.ErrConflict), c.conflict)
		}
		if c.conflict && err.Error() != "bindings: write conflict: "+c.err.Error() {
			t.Errorf("%s: text %q", c.name, err.Error())
		}
	}
}

// The mode rule of RouteMode: the request's mode applies to the binding it
// creates; an existing binding keeps its stored mode whatever a later
// request asks for.
func TestRouteModeStoredModeWins(t *testing.T) {
	tb := newEnv(t).open(Config{DefaultMode: session.Hard})
	ctx := ctxT(t, 10*time.Second)
	cases := []struct {
		name        string
		session     string
		first, next session.Mode
		want        session.Mode
	}{
		{"unset takes the default", "s-default", session.Unset, session.Unset, session.Hard},
		{"request creates soft", "s-soft", session.Soft, session.Unset, session.Soft},
		{"stored soft wins over a hard request", "s-soft2", session.Soft, session.Hard, session.Soft},
		{"stored hard wins over a soft request", "s-hard", session.Hard, session.Soft, session.Hard},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := tb.RouteMode(ctx, model, c.session, c.first, always("w1"))
			if err != nil || r.Outcome != Created || r.Binding.Mode != c.want {
				t.Fatalf("first: %+v, %v (want mode %v)", r, err, c.want)
			}
			// Soft re-binds to another worker; Hard (w1 live by default) rejects.
			r, err = tb.RouteMode(ctx, model, c.session, c.next, always("w2"))
			if c.want == session.Soft && (err != nil || r.Outcome != Rebound || r.Binding.Mode != session.Soft) {
				t.Fatalf("next: %+v, %v (want a Soft re-bind)", r, err)
			}
			if c.want == session.Hard && (err == nil || r.Outcome != Rejected || r.Binding.Mode != session.Hard) {
				t.Fatalf("next: %+v, %v (want a Hard rejection)", r, err)
			}
		})
	}
	if _, err := tb.RouteMode(ctx, model, "s-bad", session.Mode(9), always("w1")); !errors.Is(err, session.ErrUnknownMode) {
		t.Fatalf("mode 9: %v, want ErrUnknownMode", err)
	}
}
