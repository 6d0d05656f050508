package host

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/workers"
)

// Tests of event intake (intake*.go): only registered workers' events
// reach the index (the hold), and snapshots are verified before they are
// trusted. The helpers are state_test.go's.

// Events of a worker that is not in the registry never reach the index
// or a snapshot: held for the grace, then dropped and counted.
func TestEventsOfUnregisteredWorkerNotIndexed(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1, mutate: func(_ int, c *Config) {
		c.IndexLimits.EventHoldGrace = 200 * time.Millisecond
	}})
	r := st.replicas[0]
	st.register("live", 4096)
	st.waitWorkers(1)
	st.publishStored("ghost", 1, 0, 10)
	st.publishStored("live", 1, 100, 10)
	st.caughtUp(r)
	if got := indexedWorkers(r); !slices.Equal(got, []string{"live"}) {
		t.Fatalf("index holds workers %v, want [live]", got)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return r.intake.hold.dropped.Load() == 1 },
		func() string {
			return fmt.Sprintf("held batches of ghost: %d held, %d dropped, want dropped after the grace",
				r.intake.hold.held.Load(), r.intake.hold.dropped.Load())
		})
	if got := indexedWorkers(r); !slices.Equal(got, []string{"live"}) {
		t.Fatalf("index holds workers %v after the grace, want [live]", got)
	}
	for res, want := range map[string]float64{"held": 1, "dropped": 1, "released": 0} {
		if v := metricValue(t, r, `kvr_events_unregistered_total{result="`+res+`"}`); v != want {
			t.Errorf("kvr_events_unregistered_total{result=%q} %v, want %v", res, v, want)
		}
	}
	if got := st.snapshotWorkers(r); !slices.Equal(got, []string{"live"}) {
		t.Fatalf("snapshot carries workers %v, want [live]", got)
	}
}

// A worker's first batches may arrive before its registration: they are
// held and applied, in order, when it arrives.
func TestEventsHeldUntilRegistration(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	r := st.replicas[0]
	st.publishStored("late", 1, 0, 10)
	st.publishStored("late", 2, 10, 10)
	st.caughtUp(r)
	if n := r.intake.hold.held.Load(); n != 2 || blocksOf(r, "late") != 0 {
		t.Fatalf("%d batches held, %d blocks indexed before the registration, want 2 and 0", n, blocksOf(r, "late"))
	}
	st.register("late", 4096)
	testutil.Eventually(t, 10*time.Second, func() bool { return blocksOf(r, "late") == 20 },
		func() string {
			return fmt.Sprintf("late holds %d blocks after registering, want 20", blocksOf(r, "late"))
		})
	st.publishStored("late", 3, 20, 10)
	st.caughtUp(r)
	if got := blocksOf(r, "late"); got != 30 {
		t.Fatalf("late holds %d blocks, want 30", got)
	}
	if rel, drop := r.intake.hold.released.Load(), r.intake.hold.dropped.Load(); rel != 2 || drop != 0 {
		t.Fatalf("released %d dropped %d, want 2 and 0", rel, drop)
	}
}

// Sequence-keyed batches (kvrouter bridge's) are held the same way, their
// removals copied with them: the subscriber reuses its buffers, so a held
// removal that aliased them would name the next batch's blocks.
func TestSeqKeyedEventsHeldUntilRegistration(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	r := st.replicas[0]
	publish := func(first uint64, ev kvevents.Event) {
		t.Helper()
		b := &kvevents.Batch{Model: testModel, Worker: "late", Epoch: 1, FirstEventID: first, SeqKeyed: true,
			Events: []kvevents.Event{ev}}
		data, err := kvevents.AppendBatch(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.js.Publish(ctxT(t), kvevents.EventSubject("", testModel, "late"), data); err != nil {
			t.Fatal(err)
		}
	}
	stored := kvevents.Event{Kind: kvevents.KindStored}
	for i := 1; i <= 10; i++ {
		stored.Blocks = append(stored.Blocks, kvevents.StoredBlock{Seq: kvevents.SeqHash(i)})
	}
	publish(1, stored)
	publish(2, kvevents.Event{Kind: kvevents.KindRemoved, RemovedSeqs: []kvevents.SeqHash{1, 2, 3}})
	publish(3, kvevents.Event{Kind: kvevents.KindRemoved, RemovedSeqs: []kvevents.SeqHash{4, 5}})
	st.caughtUp(r)
	if n := r.intake.hold.held.Load(); n != 3 {
		t.Fatalf("%d batches held before the registration, want 3", n)
	}
	st.register("late", 4096)
	testutil.Eventually(t, 10*time.Second, func() bool { return r.intake.hold.released.Load() == 3 },
		func() string { return fmt.Sprintf("%d of 3 held batches released", r.intake.hold.released.Load()) })
	if got := blocksOf(r, "late"); got != 5 {
		t.Fatalf("late holds %d blocks, want 5 (10 stored, 5 removed)", got)
	}
}

// A worker that leaves the registry leaves the index and the next
// snapshot.
func TestDepartedWorkerLeavesIndexAndSnapshot(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	r := st.replicas[0]
	gone := st.register("gone", 4096)
	st.register("stays", 4096)
	st.waitWorkers(2)
	st.publishStored("gone", 1, 0, 10)
	st.publishStored("stays", 1, 100, 10)
	st.caughtUp(r)
	if got := st.snapshotWorkers(r); !slices.Equal(got, []string{"gone", "stays"}) {
		t.Fatalf("snapshot carries %v, want both workers", got)
	}
	if err := gone.Deregister(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(indexedWorkers(r), []string{"stays"}) },
		func() string { return fmt.Sprintf("index holds %v after gone departed", indexedWorkers(r)) })
	st.publishStored("stays", 2, 110, 1) // a newer stream sequence, so a new snapshot is written
	st.caughtUp(r)
	if got := st.snapshotWorkers(r); !slices.Equal(got, []string{"stays"}) {
		t.Fatalf("next snapshot carries %v, want [stays]", got)
	}
}

// A snapshot claiming a stream sequence past the stream's end (anyone who
// can write the bucket can store one) is skipped, logged and counted, and
// the replica loads the previous one and really follows the stream; a
// snapshot's workers that are not registered are left out. Before, the new
// replica reported ready and never applied another event.
func TestForgedSnapshotSkipped(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	st.register("w", 4096)
	st.waitWorkers(1)
	st.publishStored("w", 1, 0, 10)
	st.caughtUp(st.replicas[0])
	st.replicas[0].intake.writeSnapshots() // the real snapshot, at sequence 1
	forged := index.New(index.Config{Model: testModel})
	for _, w := range []string{"w", "ghost"} {
		forged.ApplyBatch(1<<40, &kvevents.Batch{Model: testModel, Worker: w, Events: []kvevents.Event{{
			Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 7, Seq: 7}}}}})
	}
	if _, err := index.SaveSnapshot(ctxT(t), st.js, "", forged); err != nil {
		t.Fatal(err)
	}
	r := st.startReplica("fresh", func(c *Config) { c.LoadSnapshot = true })
	ms := r.models[testModel]
	if n := ms.snapRejected.Load(); n != 1 {
		t.Fatalf("%d snapshots rejected, want the forged one", n)
	}
	if got := indexedWorkers(r); !slices.Equal(got, []string{"w"}) || blocksOf(r, "w") != 10 {
		t.Fatalf("restored workers %v (w: %d blocks), want w's 10 blocks from the real snapshot", got, blocksOf(r, "w"))
	}
	st.publishStored("w", 2, 10, 5)
	testutil.Eventually(t, 10*time.Second, func() bool { return blocksOf(r, "w") == 15 },
		func() string {
			return fmt.Sprintf("new replica holds %d blocks of w, want 15: it does not follow the stream", blocksOf(r, "w"))
		})
}

// Workers a (valid) snapshot holds that are not in the registry are left
// out when it is restored.
func TestSnapshotWorkersNotRegisteredLeftOut(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 0})
	ctx := ctxT(t)
	if _, err := kvevents.EnsureStream(ctx, st.js, kvevents.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	st.register("w", 4096)
	st.publishStored("w", 1, 0, 10)
	x := index.New(index.Config{Model: testModel})
	for _, w := range []string{"w", "ghost"} {
		x.ApplyBatch(1, &kvevents.Batch{Model: testModel, Worker: w, Events: []kvevents.Event{{
			Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 7, Seq: 7}}}}})
	}
	if _, err := index.SaveSnapshot(ctx, st.js, "", x); err != nil {
		t.Fatal(err)
	}
	r := st.startReplica("fresh", func(c *Config) { c.LoadSnapshot = true })
	if got := indexedWorkers(r); !slices.Equal(got, []string{"w"}) {
		t.Fatalf("restored workers %v, want [w]", got)
	}
	if n := r.models[testModel].snapRejected.Load(); n != 0 {
		t.Fatalf("%d snapshots rejected, want 0", n)
	}
}

// The hold is bounded: past EventHoldMax batches, more batches of
// unregistered workers are dropped at once, not queued.
func TestEventHoldBounded(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1, mutate: func(_ int, c *Config) {
		c.IndexLimits.EventHoldMax = 2
	}})
	r := st.replicas[0]
	for i := 0; i < 5; i++ {
		st.publishStored(fmt.Sprintf("ghost-%d", i), 1, 0, 10)
	}
	st.caughtUp(r)
	h := &r.intake.hold
	if held, dropped := h.held.Load(), h.dropped.Load(); held != 2 || dropped != 3 || h.n.Load() != 2 {
		t.Fatalf("held %d dropped %d (queue %d), want 2 held and 3 dropped", held, dropped, h.n.Load())
	}
	if got := indexedWorkers(r); len(got) != 0 {
		t.Fatalf("index holds %v", got)
	}
}

// A worker's first batch and its registration race: the batch may find the
// worker unregistered just before the registration lands, and reach the
// hold just after the registration released it. It must be applied then,
// not left in the hold to be dropped at the end of the grace (what made
// the route benchmarks' setup wait fail now and then: one dropped batch in
// 32 workers' first events).
func TestEventsAndRegistrationRace(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	r := st.replicas[0]
	ms := r.models[testModel]
	for i := range 2000 {
		id := fmt.Sprintf("racer-%d", i)
		info := workers.Info{ID: id, Model: testModel, Endpoint: "http://" + id, Ranks: []uint32{0}, BlockSize: ms.blockSize, KVBlocks: 1024}
		b := &kvevents.Batch{Model: testModel, Worker: id, Epoch: 1, FirstEventID: 1,
			Events: []kvevents.Event{{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 1, Seq: kvevents.SeqHash(i + 1)}}}}}
		var wg sync.WaitGroup
		wg.Go(func() { r.intake.apply(ms, uint64(i+1), b) })
		wg.Go(func() {
			ms.setWorker(id, &info) // as onJoin does: the view first, then the release
			r.intake.admit(ms, info)
		})
		wg.Wait()
		if n := r.intake.hold.n.Load(); n != 0 {
			t.Fatalf("round %d: %d batch(es) still held after the worker registered", i, n)
		}
	}
}
