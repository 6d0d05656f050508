package host

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
)

// Tests of the bounded index and what may enter it: the memory budget,
// events only from registered workers, departed workers, and snapshots
// verified before they are trusted (issue 16).

// register puts a worker of testModel with one rank into the registry
// until the test ends (or it is deregistered).
func (st *stack) register(id string, kvBlocks int) *workers.Registration {
	st.t.Helper()
	reg, err := workers.Register(ctxT(st.t), st.js, testRegistry(), workers.Info{
		ID: id, Model: testModel, Endpoint: "kvr.test." + id, Ranks: []uint32{0}, BlockSize: DefaultBlockSize,
		KVBlocks: kvBlocks, MaxBatchedTokens: 8192, MaxSeqs: 64, Epoch: 1, State: workers.StateReady,
	})
	if err != nil {
		st.t.Fatal(err)
	}
	st.t.Cleanup(reg.Stop)
	return reg
}

// publishStored publishes, on worker's own subject, one batch (epoch 1,
// ids from first) of one Stored event per block with engine and sequence
// hashes from..from+n-1.
func (st *stack) publishStored(worker string, first uint64, from, n int) {
	st.t.Helper()
	b := &kvevents.Batch{Model: testModel, Worker: worker, Epoch: 1, FirstEventID: first}
	ev := kvevents.Event{Kind: kvevents.KindStored}
	for i := from; i < from+n; i++ {
		ev.Blocks = append(ev.Blocks, kvevents.StoredBlock{Engine: kvevents.EngineHash(i + 1), Seq: kvevents.SeqHash(i + 1)})
	}
	b.Events = append(b.Events, ev)
	data, err := kvevents.AppendBatch(nil, b)
	if err != nil {
		st.t.Fatal(err)
	}
	if _, err := st.js.Publish(ctxT(st.t), kvevents.EventSubject("", testModel, worker), data); err != nil {
		st.t.Fatal(err)
	}
}

// caughtUp waits until r's subscriber has handled every event message.
func (st *stack) caughtUp(r *Replica) {
	st.t.Helper()
	if err := r.subscriber.WaitCaughtUp(ctxT(st.t)); err != nil {
		st.t.Fatal(err)
	}
}

// blocksOf is how many blocks r's index holds for worker's rank 0.
func blocksOf(r *Replica, worker string) int {
	return r.models[testModel].index.WorkerBlocks(workerref.Target{Worker: worker})
}

// indexedWorkers lists the workers r's index knows, sorted.
func indexedWorkers(r *Replica) []string {
	var out []string
	for _, k := range r.models[testModel].index.Workers() {
		out = append(out, k.Worker)
	}
	slices.Sort(out)
	return out
}

// snapshotWorkers writes r's snapshot now and returns the workers of the
// newest stored one, sorted.
func (st *stack) snapshotWorkers(r *Replica) []string {
	st.t.Helper()
	r.writeSnapshots()
	x := index.New(index.Config{Model: testModel})
	if _, err := index.LoadSnapshot(ctxT(st.t), st.js, "", x); err != nil {
		st.t.Fatal(err)
	}
	var out []string
	for _, d := range x.Dump() {
		out = append(out, d.Key.Worker)
	}
	slices.Sort(out)
	return out
}

// startReplica starts one more replica on st's server.
func (st *stack) startReplica(id string, mutate func(*Config)) *Replica {
	st.t.Helper()
	cfg := Config{ReplicaID: id, Models: []string{testModel}, Registry: testRegistry(),
		Bindings: bindings.Config{IdleTTL: 10 * time.Second, MarkerTTL: time.Second}, Logger: testLogger(st.t)}
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := New(natstest.Connect(st.t, st.srv), cfg)
	if err != nil {
		st.t.Fatal(err)
	}
	st.t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(cctx); err != nil {
			st.t.Errorf("replica %s close: %v", id, err)
		}
	})
	if err := r.Start(ctxT(st.t)); err != nil {
		st.t.Fatalf("replica %s start: %v", id, err)
	}
	return r
}

// A replica started with no index flags has a cap on its index and on each
// worker rank; before, nothing set index.Config.MaxEntries.
func TestIndexCappedByDefault(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	cfg := st.replicas[0].models[testModel].index.Config()
	if cfg.MaxEntries <= 0 || cfg.MaxEntriesPerWorker <= 0 || int64(cfg.MaxEntriesPerWorker) > cfg.MaxEntries {
		t.Fatalf("default index caps: %d entries, %d per worker; want both set", cfg.MaxEntries, cfg.MaxEntriesPerWorker)
	}
}

// One worker flooding unique hashes stops at its cap, the index stays
// within its budget, and the other workers' blocks are still indexed; a
// worker is also capped at twice the kv_blocks it registered.
func TestIndexBudgetHoldsAgainstAFlood(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1, mutate: func(_ int, c *Config) {
		c.IndexLimits = IndexLimits{MaxEntries: 20_000, MaxEntriesPerWorker: 5_000}
	}})
	r := st.replicas[0]
	st.register("flood", 1<<20)
	st.register("small", 100)
	st.register("good", 4096)
	st.waitWorkers(3)
	for i := 0; i < 50; i++ {
		st.publishStored("flood", uint64(i+1), 1_000_000+i*1000, 1000)
	}
	st.publishStored("small", 1, 2_000_000, 1000)
	st.publishStored("good", 1, 0, 100)
	st.caughtUp(r)
	if got := blocksOf(r, "flood"); got != 5_000 {
		t.Errorf("flooding worker holds %d blocks, want its cap 5,000", got)
	}
	if got := blocksOf(r, "small"); got != 200 {
		t.Errorf("worker registered with 100 kv_blocks holds %d blocks, want 200", got)
	}
	if got := blocksOf(r, "good"); got != 100 {
		t.Errorf("well-behaved worker holds %d blocks, want all 100", got)
	}
	s := r.models[testModel].index.Stats()
	if s.Entries > 20_000 || s.RefusedStores != 45_000+800 {
		t.Fatalf("index: %d entries (cap 20,000), %d stores refused (want 45,800)", s.Entries, s.RefusedStores)
	}
	if v := metricValue(t, r, `kvr_index_refused_stores_total{model="m"}`); v != 45_800 {
		t.Fatalf("kvr_index_refused_stores_total %v, want 45800", v)
	}
}

func TestIndexLimitsNormalize(t *testing.T) {
	const gib = int64(1) << 30
	mem := func(n int64) func() int64 { return func() int64 { return n } }
	cases := []struct {
		name      string
		in        IndexLimits
		models    int
		mem       int64
		entries   int64
		perWorker int64
	}{
		{"quarter of memory, split by model", IndexLimits{}, 2, 8 * gib, 2 * gib / 2 / IndexBytesPerEntry, 2 * gib / 2 / IndexBytesPerEntry / 8},
		{"memory unknown", IndexLimits{}, 1, 0, DefaultIndexMaxBytesFallback / IndexBytesPerEntry, DefaultIndexMaxBytesFallback / IndexBytesPerEntry / 8},
		{"bytes given", IndexLimits{MaxBytes: 96_000}, 1, 8 * gib, 1000, 125},
		{"entries given", IndexLimits{MaxBytes: 96_000, MaxEntries: 50}, 1, 8 * gib, 50, 6},
		{"per worker given", IndexLimits{MaxEntries: 50, MaxEntriesPerWorker: 50}, 1, 8 * gib, 50, 50},
		{"no cap", IndexLimits{MaxBytes: -1}, 1, 8 * gib, -1, -1},
		{"no worker cap", IndexLimits{MaxEntries: 10, MaxEntriesPerWorker: -5}, 1, 8 * gib, 10, -1},
		{"tiny budget", IndexLimits{MaxBytes: 1}, 3, 8 * gib, 1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := c.in
			l.normalize(c.models, mem(c.mem))
			if l.MaxEntries != c.entries || l.MaxEntriesPerWorker != c.perWorker {
				t.Fatalf("entries %d per worker %d, want %d %d", l.MaxEntries, l.MaxEntriesPerWorker, c.entries, c.perWorker)
			}
			if l.EventHoldGrace != DefaultEventHoldGrace || l.EventHoldMax != DefaultEventHoldMax {
				t.Fatalf("hold %v %d", l.EventHoldGrace, l.EventHoldMax)
			}
		})
	}
}

func TestMemoryLimit(t *testing.T) {
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			if v, ok := m[p]; ok {
				return []byte(v), nil
			}
			return nil, os.ErrNotExist
		}
	}
	const meminfo = "MemTotal:       24683584 kB\nMemFree:  1 kB\n"
	cases := []struct {
		name    string
		files   map[string]string
		goLimit int64
		want    int64
	}{
		{"meminfo only", map[string]string{"/proc/meminfo": meminfo}, math.MaxInt64, 24683584 * 1024},
		{"cgroup v2 limit", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory.max": "2147483648\n"}, math.MaxInt64, 2 << 30},
		{"cgroup v2 unlimited", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory.max": "max\n"}, math.MaxInt64, 24683584 * 1024},
		{"cgroup v1 unlimited", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, math.MaxInt64, 24683584 * 1024},
		{"GOMEMLIMIT lower", map[string]string{"/proc/meminfo": meminfo}, 1 << 30, 1 << 30},
		{"nothing readable", nil, math.MaxInt64, 0},
		{"garbage meminfo", map[string]string{"/proc/meminfo": "MemTotal: lots\n"}, math.MaxInt64, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := memoryLimit(files(c.files), c.goLimit); got != c.want {
				t.Fatalf("memoryLimit = %d, want %d", got, c.want)
			}
		})
	}
}

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
	testutil.Eventually(t, 10*time.Second, func() bool { return r.eventSink.hold.dropped.Load() == 1 },
		func() string {
			return fmt.Sprintf("held batches of ghost: %d held, %d dropped, want dropped after the grace",
				r.eventSink.hold.held.Load(), r.eventSink.hold.dropped.Load())
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
	if n := r.eventSink.hold.held.Load(); n != 2 || blocksOf(r, "late") != 0 {
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
	if rel, drop := r.eventSink.hold.released.Load(), r.eventSink.hold.dropped.Load(); rel != 2 || drop != 0 {
		t.Fatalf("released %d dropped %d, want 2 and 0", rel, drop)
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
	st.replicas[0].writeSnapshots() // the real snapshot, at sequence 1
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
	h := &r.eventSink.hold
	if held, dropped := h.held.Load(), h.dropped.Load(); held != 2 || dropped != 3 || h.n.Load() != 2 {
		t.Fatalf("held %d dropped %d (queue %d), want 2 held and 3 dropped", held, dropped, h.n.Load())
	}
	if got := indexedWorkers(r); len(got) != 0 {
		t.Fatalf("index holds %v", got)
	}
}
