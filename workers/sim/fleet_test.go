package sim

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/nats-io/nats.go/jetstream"
)

// streamMirror follows the event stream the way a router's subscriber
// does: per (worker, rank) it checks event ids are consecutive within an
// epoch, drops everything on a new epoch, and applies events to a mirror.
type streamMirror struct {
	mu     sync.Mutex
	m      *mirror
	epochs map[workerref.Target]uint64
	next   map[workerref.Target]uint64
	err    error
	events int
}

func followStream(t *testing.T, js jetstream.JetStream) *streamMirror {
	t.Helper()
	sm := &streamMirror{m: newMirror(t), epochs: map[workerref.Target]uint64{}, next: map[workerref.Target]uint64{}}
	ctx := context.Background()
	cons, err := js.OrderedConsumer(ctx, kvevents.DefaultStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		var b kvevents.Batch
		err := kvevents.DecodeBatch(msg.Data(), &b)
		sm.mu.Lock()
		defer sm.mu.Unlock()
		if sm.err != nil {
			return
		}
		if err != nil {
			sm.err = err
			return
		}
		k := b.Key()
		if sm.epochs[k] != b.Epoch {
			sm.epochs[k], sm.next[k] = b.Epoch, 1
			clear(sm.m.blocks[k])
		}
		if b.FirstEventID != sm.next[k] {
			sm.err = fmt.Errorf("%v epoch %d: event id %d, want %d", k, b.Epoch, b.FirstEventID, sm.next[k])
			return
		}
		sm.next[k] += uint64(len(b.Events))
		sm.events += len(b.Events)
		sm.err = sm.m.applyErr(k, b.Events)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return sm
}

// waitEqual waits until the stream mirror describes exactly want.
func (sm *streamMirror) waitEqual(t *testing.T, want map[workerref.Target][]kvevents.SeqHash) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sm.mu.Lock()
		err := sm.err
		same := true
		for k, hs := range want {
			if !slices.Equal(sm.m.seqs(k), hs) {
				same = false
			}
		}
		sm.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events never converged to the engines' caches")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var quiet = slog.New(slog.DiscardHandler)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFleetEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("registry TTLs and real publishers: a few seconds")
	}
	s := natstest.Start(t)
	nc, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kvevents.EnsureStream(ctx, js, kvevents.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	sm := followStream(t, js)

	var mu sync.Mutex
	joins, departs := map[string][]uint64{}, map[string]int{}
	mem, err := workers.WatchMembership(ctx, js, workers.RegistryConfig{Logger: quiet}, workers.Callbacks{
		OnJoin:   func(i workers.Info) { mu.Lock(); joins[i.ID] = append(joins[i.ID], i.Epoch); mu.Unlock() },
		OnDepart: func(i workers.Info) { mu.Lock(); departs[i.ID]++; mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Stop()
	loads := make(chan workers.LoadReport, 64)
	ls, err := workers.SubscribeLoad(nc, "", "m", func(r workers.LoadReport) {
		select {
		case loads <- r:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Stop()

	f, err := NewFleet(FleetConfig{
		Count:        2,
		Engine:       Config{Model: "m", KVBlocks: 64, Speedup: 100},
		NewEmitter:   PublisherFactory(js, kvevents.PublisherConfig{Model: "m", MaxDelay: time.Millisecond}),
		LoadInterval: 50 * time.Millisecond,
		Drain:        workers.DrainConfig{Grace: -1, MaxWait: 5 * time.Second},
		Registry:     workers.RegistryConfig{Logger: quiet},
		Logger:       quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(ctx, nc, js); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = f.Stop(context.Background())
		}
	}()
	engines := f.Engines()
	waitFor(t, "both workers to join", func() bool { return mem.Len() == 2 })
	if !mem.Live("sim-0") || !mem.Live("sim-1") {
		t.Fatalf("members %v", mem.Workers())
	}
	select {
	case r := <-loads:
		if r.KVTotalBlocks != 64 || (r.Worker != "sim-0" && r.Worker != "sim-1") {
			t.Fatalf("load %+v", r)
		}
	case <-ctx.Done():
		t.Fatal("no load report")
	}

	// Traffic on both workers, enough to evict (64 blocks each).
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 40; i++ {
		wg.Go(func() {
			w := engines[i%2]
			prompt := cat(seq(1, 256), seq(10000*(i+1), 100+i*7))
			_, err := Generate(ctx, nc, w.Endpoint(), &GenerateRequest{RequestID: fmt.Sprint("q", i), TokenIDs: prompt, MaxTokens: 20}, nil)
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	dump := f.Dump()
	if len(dump) != 2 || len(dump[workerref.Target{Worker: "sim-0"}]) == 0 {
		t.Fatalf("dump %v", dump)
	}
	sm.waitEqual(t, dump)
	var removed uint64
	for _, e := range engines {
		removed += e.Stats()[0].RemovedBlocks
	}
	if removed == 0 {
		t.Fatal("workload did not evict")
	}

	// sim-0's key vanishes (as after a long pause): the heartbeat creates it
	// again and the engine re-announces its whole cache.
	kv, err := js.KeyValue(ctx, workers.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	before := engines[0].Stats()[0].StoredBlocks
	if err := kv.Delete(ctx, workers.KeyFor("sim-0")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "re-announce", func() bool {
		return engines[0].Stats()[0].StoredBlocks >= before+uint64(len(dump[workerref.Target{Worker: "sim-0"}]))
	})
	waitFor(t, "sim-0 back in the registry", func() bool { return mem.Live("sim-0") })
	sm.waitEqual(t, f.Dump())

	// Restart sim-1: new epoch, registered again, old blocks dropped.
	oldEpoch := engines[1].Epoch()
	if err := f.Restart(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "re-incarnation", func() bool {
		ep, ok := mem.Epoch("sim-1")
		return ok && ep == engines[1].Epoch() && ep != oldEpoch
	})
	sm.waitEqual(t, f.Dump())
	sm.mu.Lock()
	if sm.epochs[workerref.Target{Worker: "sim-1"}] != engines[1].Epoch() {
		t.Errorf("stream epoch of sim-1 %d, want %d", sm.epochs[workerref.Target{Worker: "sim-1"}], engines[1].Epoch())
	}
	sm.mu.Unlock()
	if _, err := Generate(ctx, nc, engines[1].Endpoint(), &GenerateRequest{RequestID: "after", TokenIDs: seq(1, 300), MaxTokens: 2}, nil); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	sm.waitEqual(t, f.Dump())

	// Graceful stop: keys deleted, caches cleared.
	stopped = true
	if err := f.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "departures", func() bool { return mem.Len() == 0 })
	empty := map[workerref.Target][]kvevents.SeqHash{{Worker: "sim-0"}: {}, {Worker: "sim-1"}: {}}
	sm.waitEqual(t, empty)
	// OnDepart runs once the member has left the view
	// (Membership.departAndUnlock), so mem.Len() reads 0 just before the
	// last call.
	waitFor(t, "the departure callbacks", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return departs["sim-0"] >= 2 && departs["sim-1"] >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if len(joins["sim-1"]) != 2 || departs["sim-1"] != 2 || len(joins["sim-0"]) != 2 || departs["sim-0"] != 2 {
		t.Fatalf("joins %v departs %v", joins, departs)
	}
}
