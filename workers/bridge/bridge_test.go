package bridge

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
)

// After a workload with evictions, the mirror (what every router index
// holds) equals the engine's true cache, and the worker is registered with
// the engine's URL, its rank, block size and capacity: with the default
// sequence-keyed batches and with engine-keyed ones (--engine-keyed).
func TestIndexEqualsEngineCache(t *testing.T) {
	for _, engineKeyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "seq-keyed", true: "engine-keyed"}[engineKeyed], func(t *testing.T) {
			testIndexEqualsEngineCache(t, engineKeyed)
		})
	}
}

func testIndexEqualsEngineCache(t *testing.T, engineKeyed bool) {
	f := newFleet(t)
	e := startEngine(t, "w1", engineOpts{kvBlocks: 48})
	cfg := bridgeCfg(e, "w1")
	cfg.EngineKeyed = engineKeyed
	br := runBridge(t, f, cfg)
	waitRegistered(t, f, "w1")
	info, _ := registered(t, f.js, "w1")
	if info.Endpoint != e.srv.URL || info.BlockSize != testBlock || info.KVBlocks != 48 ||
		len(info.Ranks) != 1 || info.Ranks[0] != 0 || info.Model != testModel || info.State != workers.StateReady {
		t.Fatalf("registered %+v", info)
	}
	e.workload(t, 0, 60, 1)
	if st := e.eng.Stats()[0]; st.RemovedBlocks == 0 {
		t.Fatalf("the workload evicted nothing (%+v): the test would not cover removals", st)
	}
	converged(t, f, e, "w1")
	if n := f.mirror.seqKeyed.Load(); (n == 0) != engineKeyed {
		t.Fatalf("engine-keyed %v, but %d sequence-keyed batches arrived", engineKeyed, n)
	}
	if err := br.halt(t); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if _, ok := registered(t, f.js, "w1"); ok {
		t.Fatal("still registered after drain")
	}
}

// A bridge whose engine's block size differs from the routers' refuses to
// start and names both sizes; so does --block-size against the engine's.
func TestBlockSizeMismatch(t *testing.T) {
	f := newFleet(t)
	e := startEngine(t, "w1", engineOpts{})
	for _, tc := range []struct {
		name        string
		router, own int
		want        []string
	}{
		{"router", 32, 0, []string{"engine block size 16", "router block size 32"}},
		{"flag", 16, 32, []string{"--block-size 32", "says 16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := bridgeCfg(e, "w1")
			cfg.RouterBlockSize, cfg.BlockSize = tc.router, tc.own
			b, err := New(cfg, f.nc, f.js)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = b.Run(ctx)
			if !errors.Is(err, ErrBlockSize) {
				t.Fatalf("Run = %v, want ErrBlockSize", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if _, ok := registered(t, f.js, "w1"); ok {
				t.Fatal("registered despite the mismatch")
			}
		})
	}
}

// While the engine is unreachable the bridge waits, readyz says 503 and no
// worker is registered; once it answers the worker joins. Health failure
// and stale metrics each make it unavailable; recovery makes it ready.
func TestEligibility(t *testing.T) {
	f := newFleet(t)
	e := startEngine(t, "w1", engineOpts{})
	e.sick.Store(true)
	br := runBridge(t, f, bridgeCfg(e, "w1"))
	h := httptest.NewServer(br.b.Handler())
	defer h.Close()
	status := func(path string) int {
		resp, err := http.Get(h.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	time.Sleep(300 * time.Millisecond) // several health attempts: it must still not register
	if _, ok := registered(t, f.js, "w1"); ok {
		t.Fatal("registered a worker whose engine is not healthy")
	}
	if got := status("/readyz"); got != http.StatusServiceUnavailable {
		t.Fatalf("readyz = %d while the engine is down, want 503", got)
	}
	if got := status("/healthz"); got != http.StatusOK {
		t.Fatalf("healthz = %d", got)
	}
	e.sick.Store(false)
	state := func(want workers.State) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() bool {
			i, ok := registered(t, f.js, "w1")
			return ok && i.State == want
		}, func() string {
			i, _ := registered(t, f.js, "w1")
			return "state " + string(want) + ", have " + string(i.State)
		})
	}
	state(workers.StateReady)
	testutil.Eventually(t, 2*time.Second, func() bool { return status("/readyz") == http.StatusOK },
		func() string { return "readyz 200" })

	e.sick.Store(true)
	state(workers.StateUnavailable)
	if got := status("/readyz"); got != http.StatusServiceUnavailable {
		t.Fatalf("readyz = %d with the engine unhealthy", got)
	}
	e.sick.Store(false)
	state(workers.StateReady)

	e.mute.Store(true) // scrapes fail: after 3 intervals the load is stale
	state(workers.StateUnavailable)
	e.mute.Store(false)
	state(workers.StateReady)

	// Load reports carry the engine's gauges.
	got := make(chan workers.LoadReport, 16)
	ls, err := workers.SubscribeLoad(f.nc, "", testModel, func(l workers.LoadReport) {
		select {
		case got <- l:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Stop()
	select {
	case l := <-got:
		if l.Worker != "w1" || l.KVTotalBlocks != 64 {
			t.Fatalf("load report %+v", l)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no load report")
	}

	if err := br.halt(t); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if _, ok := registered(t, f.js, "w1"); ok {
		t.Fatal("still registered after drain")
	}
}

// Two data-parallel ranks of one engine are two ranks of one worker.
func TestTwoDataParallelRanks(t *testing.T) {
	f := newFleet(t)
	base := testutil.FreePorts(t, 4)
	e := startEngine(t, "w2", engineOpts{ranks: 2, basePort: base})
	cfg := bridgeCfg(e, "w2")
	cfg.KVEvents = "tcp://127.0.0.1:" + itoa(base)
	cfg.KVReplay = "tcp://127.0.0.1:" + itoa(base+2)
	cfg.DataParallelSize = 2
	runBridge(t, f, cfg)
	waitRegistered(t, f, "w2")
	if info, _ := registered(t, f.js, "w2"); len(info.Ranks) != 2 || info.Ranks[1] != 1 {
		t.Fatalf("ranks %v, want [0 1]", info.Ranks)
	}
	e.workload(t, 0, 20, 1)
	e.workload(t, 1, 20, 2)
	converged(t, f, e, "w2")
	for r := range uint32(2) {
		if len(f.mirror.seqs(workerref.Target{Worker: "w2", Rank: r})) == 0 {
			t.Fatalf("rank %d holds nothing", r)
		}
	}
}
