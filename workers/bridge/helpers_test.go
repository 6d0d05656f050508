package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

func TestMain(m *testing.M) {
	// zmq4's parked goroutines behind closed sockets (testutil.IgnoreZMQ4);
	// everything else must stop.
	goleak.VerifyTestMain(m, append(testutil.IgnoreZMQ4(), testutil.IgnoreNATSAsyncReply())...)
}

var quiet = slog.New(slog.DiscardHandler)

const (
	testModel = "m"
	testBlock = 16
)

// fleet is an embedded NATS server with the event stream, and a mirror:
// a router index without the prefix tree, fed by a kvevents.Subscriber.
type fleet struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	mirror *mirror
}

func newFleet(t testing.TB) *fleet {
	t.Helper()
	s := natstest.Start(t)
	nc, js := natstest.JetStream(t, s)
	ctx := context.Background()
	if _, err := kvevents.EnsureStream(ctx, js, kvevents.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	m := &mirror{blocks: map[workerref.Target]map[kvevents.EngineHash]kvevents.SeqHash{},
		seqBlocks: map[workerref.Target]map[kvevents.SeqHash]uint8{}}
	sub, err := kvevents.NewSubscriber(js, kvevents.SubscriberConfig{Sink: m, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); sub.Run(sctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &fleet{nc: nc, js: js, mirror: m}
}

// mirror holds what a router index would: per rank, engine hash -> sequence
// hash from engine-keyed batches, and sequence hash -> tier bits from
// sequence-keyed ones, applying events as they come and dropping a rank on
// Resync.
type mirror struct {
	mu        sync.Mutex
	blocks    map[workerref.Target]map[kvevents.EngineHash]kvevents.SeqHash
	seqBlocks map[workerref.Target]map[kvevents.SeqHash]uint8
	seqKeyed  atomic.Int64 // sequence-keyed batches applied
	resyncs   atomic.Int64
}

func (m *mirror) ApplyBatch(_ uint64, b *kvevents.Batch) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := b.Key()
	if b.SeqKeyed {
		m.seqKeyed.Add(1)
		m.applySeqKeyed(k, b)
		return
	}
	set := m.blocks[k]
	if set == nil {
		set = map[kvevents.EngineHash]kvevents.SeqHash{}
		m.blocks[k] = set
	}
	for _, ev := range b.Events {
		switch ev.Kind {
		case kvevents.KindStored:
			for _, sb := range ev.Blocks {
				set[sb.Engine] = sb.Seq
			}
		case kvevents.KindRemoved:
			for _, h := range ev.Removed {
				delete(set, h)
			}
		case kvevents.KindCleared:
			clear(set)
		}
	}
}

// applySeqKeyed applies a sequence-keyed batch: set adds and removes per
// tier, no engine hashes.
func (m *mirror) applySeqKeyed(k workerref.Target, b *kvevents.Batch) {
	set := m.seqBlocks[k]
	if set == nil {
		set = map[kvevents.SeqHash]uint8{}
		m.seqBlocks[k] = set
	}
	for _, ev := range b.Events {
		bit := uint8(1) << min(ev.Tier, 7)
		switch ev.Kind {
		case kvevents.KindStored:
			for _, sb := range ev.Blocks {
				set[sb.Seq] |= bit
			}
		case kvevents.KindRemoved:
			for _, s := range ev.RemovedSeqs {
				if set[s] &^= bit; set[s] == 0 {
					delete(set, s)
				}
			}
		case kvevents.KindCleared:
			clear(set)
		}
	}
}

func (m *mirror) Resync(sig kvevents.Signal) {
	m.resyncs.Add(1)
	m.mu.Lock()
	clear(m.blocks[sig.Key()])
	clear(m.seqBlocks[sig.Key()])
	m.mu.Unlock()
}

// seqs returns the sorted sequence hashes the mirror holds for k (on any
// tier).
func (m *mirror) seqs(k workerref.Target) []kvevents.SeqHash {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]kvevents.SeqHash, 0, len(m.blocks[k])+len(m.seqBlocks[k]))
	for _, s := range m.blocks[k] {
		out = append(out, s)
	}
	for s := range m.seqBlocks[k] {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// engine is one `sim serve`-shaped engine: the simulated core, its vLLM
// event sockets and its HTTP face on a real listener, with switches to make
// /health and /metrics fail.
type engine struct {
	eng     *sim.Engine
	events  *sim.VLLMEvents
	srv     *httptest.Server
	worker  string
	sick    atomic.Bool // /health answers 500
	mute    atomic.Bool // /metrics answers 500
	stopRun context.CancelFunc
	ran     chan struct{}
}

type engineOpts struct {
	ranks, kvBlocks, bufferSteps int
	basePort                     int  // 0 = ephemeral (one rank only)
	noReplay                     bool // no replay socket
}

func startEngine(t testing.TB, worker string, o engineOpts) *engine {
	t.Helper()
	if o.ranks == 0 {
		o.ranks = 1
	}
	if o.kvBlocks == 0 {
		o.kvBlocks = 64
	}
	if o.bufferSteps == 0 {
		o.bufferSteps = 10_000
	}
	ec := vllmzmq.DefaultConfig()
	ec.EnableKVCacheEvents, ec.BufferSteps, ec.Topic = true, o.bufferSteps, "kv"
	ec.Endpoint, ec.ReplayEndpoint = "tcp://*:0", "tcp://*:0"
	if o.basePort != 0 {
		ec.Endpoint = "tcp://*:" + strconv.Itoa(o.basePort)
		ec.ReplayEndpoint = "tcp://*:" + strconv.Itoa(o.basePort+o.ranks)
	}
	if o.noReplay {
		ec.ReplayEndpoint = ""
	}
	ev, err := sim.NewVLLMEvents(ec, o.ranks, quiet)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := sim.New(sim.Config{Worker: worker, Model: testModel, Ranks: o.ranks, BlockSize: testBlock,
		KVBlocks: o.kvBlocks, Speedup: 1000, NewEmitter: ev.Factory()})
	if err != nil {
		ev.Close()
		t.Fatal(err)
	}
	api, err := vllmapi.New(vllmapi.Config{Engine: eng, Model: testModel, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{eng: eng, events: ev, worker: worker, ran: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/health" && e.sick.Load(), r.URL.Path == "/metrics" && e.mute.Load():
			http.Error(w, "switched off by the test", http.StatusInternalServerError)
			return
		}
		api.ServeHTTP(w, r)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	e.stopRun = cancel
	go func() { defer close(e.ran); eng.Run(ctx) }()
	t.Cleanup(e.close)
	return e
}

func (e *engine) close() {
	e.srv.Close()
	e.eng.Close(context.Background())
	e.stopRun()
	<-e.ran
	e.events.Close()
}

func (e *engine) eventsEndpoint() string { return e.events.Publisher(0).Endpoint() }
func (e *engine) replayEndpoint() string { return e.events.Publisher(0).ReplayEndpoint() }

// workload runs n requests on rank, prompts of 2-6 blocks; within one
// workload they share first blocks (five families per seed), so that cached
// prefixes are reused, and with a small cache blocks are evicted.
func (e *engine) workload(t *testing.T, rank uint32, n int, seed int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range n {
		prefix := seed*5 + (seed*7919+i)%5
		blocks := 2 + (i % 5)
		toks := make([]uint32, 0, blocks*testBlock+3)
		for b := range blocks {
			for j := range testBlock {
				v := uint32(seed*1_000_003 + b*101 + j)
				if b == 0 {
					v = uint32(prefix*977 + j) // shared first block
				} else if b == 1 {
					v = uint32(prefix*977 + 50_000 + j + (i%2)*7)
				} else {
					v += uint32(i * 13)
				}
				toks = append(toks, v)
			}
		}
		toks = append(toks, 1, 2, 3)
		st, err := e.eng.Submit(ctx, sim.Request{Tokens: toks, MaxTokens: 2, Rank: rank})
		if err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
		if _, err := st.Wait(ctx); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
}

// converged waits until the mirror holds exactly the engine's cache on
// every rank.
func converged(t *testing.T, f *fleet, e *engine, worker string) {
	t.Helper()
	var last string
	testutil.Eventually(t, 10*time.Second, func() bool {
		for k, want := range e.eng.Dump() {
			k := workerref.Target{Worker: worker, Rank: k.Rank}
			got := f.mirror.seqs(k)
			if !slices.Equal(got, want) {
				last = fmt.Sprintf("%v: mirror %d blocks, engine %d (%d in common)", k, len(got), len(want), common(got, want))
				return false
			}
		}
		return true
	}, func() string { return "the index to equal the engine's cache: " + last })
}

func common(a, b []kvevents.SeqHash) int {
	n := 0
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); ok {
			n++
		}
	}
	return n
}

// bridgeCfg is a bridge on e with fast timings.
func bridgeCfg(e *engine, worker string) Config {
	return Config{
		EngineURL: e.srv.URL, KVEvents: e.eventsEndpoint(), KVReplay: e.replayEndpoint(), Topic: "kv",
		Model: testModel, WorkerID: worker, RouterBlockSize: testBlock,
		MetricsInterval: 50 * time.Millisecond, HealthInterval: 50 * time.Millisecond, ReplayTimeout: 2 * time.Second,
		Events:    kvevents.PublisherConfig{MaxDelay: time.Millisecond},
		Registry:  workers.RegistryConfig{TTL: time.Second, Heartbeat: 300 * time.Millisecond, MarkerTTL: time.Second, Logger: quiet},
		DrainWait: 2 * time.Second, Logger: quiet,
	}
}

// running is a bridge started by runBridge.
type running struct {
	b    *Bridge
	stop context.CancelFunc
	done chan struct{} // closed when Run returned err
	err  error
}

func runBridge(t *testing.T, f *fleet, cfg Config) *running {
	t.Helper()
	b, err := New(cfg, f.nc, f.js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{b: b, stop: cancel, done: make(chan struct{})}
	go func() { r.err = b.Run(ctx); close(r.done) }()
	t.Cleanup(func() { r.halt(t) })
	return r
}

// halt stops the bridge (it drains) and returns Run's error.
func (r *running) halt(t *testing.T) error {
	t.Helper()
	r.stop()
	select {
	case <-r.done:
		return r.err
	case <-time.After(15 * time.Second):
		t.Fatal("bridge did not stop")
		return nil
	}
}

// registered reads the worker's registry entry (ok false when absent).
func registered(t *testing.T, js jetstream.JetStream, id string) (workers.Info, bool) {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), workers.DefaultBucket)
	if err != nil {
		return workers.Info{}, false
	}
	e, err := kv.Get(context.Background(), workers.KeyFor(id))
	if err != nil {
		return workers.Info{}, false
	}
	info, err := workers.DecodeInfo(e.Value())
	if err != nil {
		t.Fatalf("registry value of %q: %v", id, err)
	}
	return info, true
}

func itoa(n int) string { return strconv.Itoa(n) }
