package host

import (
	"context"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
)

// Tests of the bounded index (issue 16): the memory budget and the caps.
// What may enter it (events only from registered workers, departed
// workers, snapshots verified before they are trusted) is tested in
// intake_test.go, with the helpers here.

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
	if err := r.intake.subscriber.WaitCaughtUp(ctxT(st.t)); err != nil {
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
	r.intake.writeSnapshots()
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
