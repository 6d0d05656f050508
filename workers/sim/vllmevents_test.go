package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/workerref"
)

// vllmTestConfig enables events on ephemeral ports (port 0 is not offset
// per rank: every rank binds its own).
func vllmTestConfig(bufferSteps int) vllmzmq.Config {
	cfg := vllmzmq.DefaultConfig()
	cfg.EnableKVCacheEvents = true
	cfg.Endpoint, cfg.ReplayEndpoint = "tcp://*:0", "tcp://*:0"
	cfg.BufferSteps = bufferSteps
	cfg.Topic = "kv@sim@m"
	return cfg
}

func newVLLMEvents(t testing.TB, cfg vllmzmq.Config, ranks int) *VLLMEvents {
	t.Helper()
	v, err := NewVLLMEvents(cfg, ranks, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

// follower is what a router-side bridge does with one rank's stream: live
// messages from a Subscriber, gaps filled through Replay, every payload
// decoded by the project's vLLM decoder and converted, the result applied
// to a mirror (a router index without the prefix tree). Live seqs of one
// engine process only go up, so a live seq at or below the last live one
// means a restart; one above it but below the next expected is a batch
// already replayed.
type follower struct {
	t        testing.TB
	key      workerref.Target
	sub      *vllmzmq.Subscriber
	replay   string
	m        *mirror
	conv     *vllm.Converter
	next     uint64 // seq expected next
	lastLive uint64
	seenLive bool
	vb       vllm.Batch
	out      []kvevents.Event

	applied, replays, restarts, lateReplays int
}

func newFollower(t testing.TB, key workerref.Target, p *vllmzmq.Publisher, m *mirror) *follower {
	t.Helper()
	sub, err := vllmzmq.NewSubscriber(vllmzmq.SubscriberConfig{Endpoint: p.Endpoint(), Topic: "kv@sim"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	f := &follower{t: t, key: key, sub: sub, replay: p.ReplayEndpoint(), m: m}
	f.reset()
	return f
}

// reset forgets the rank: what a client does on a restart or a lost replay.
func (f *follower) reset() {
	conv, err := vllm.NewConverter(vllm.ConverterConfig{BlockSize: DefaultBlockSize})
	if err != nil {
		f.t.Fatal(err)
	}
	f.conv = conv
	clear(f.m.blocks[f.key])
}

func (f *follower) apply(msg vllmzmq.Message) {
	f.t.Helper()
	if err := vllm.DecodeBatch(msg.Payload, &f.vb); err != nil {
		f.t.Fatalf("%v seq %d: the vLLM decoder rejects the payload: %v", f.key, msg.Seq, err)
	}
	if !f.vb.HasDPRank || f.vb.DPRank != int64(f.key.Rank) || f.vb.TS < 1e9 {
		f.t.Fatalf("%v seq %d: envelope ts %v rank %v/%d", f.key, msg.Seq, f.vb.TS, f.vb.HasDPRank, f.vb.DPRank)
	}
	var err error
	if f.out, err = f.conv.Convert(&f.vb, f.out[:0]); err != nil {
		f.t.Fatalf("%v seq %d: convert: %v", f.key, msg.Seq, err)
	}
	f.m.apply(f.key, f.out)
	f.next = msg.Seq + 1
	f.applied++
}

// fill replays from f.next; a replay that starts later than asked lost
// batches, so the rank is rebuilt from what the replay holds.
func (f *follower) fill(ctx context.Context) {
	f.t.Helper()
	res, err := vllmzmq.Replay(ctx, f.replay, f.next)
	if err != nil {
		f.t.Fatal(err)
	}
	f.replays++
	if res.Late {
		f.lateReplays++
		f.reset()
	}
	for _, b := range res.Batches {
		if b.Seq >= f.next || res.Late {
			f.apply(b)
		}
	}
}

func (f *follower) handle(ctx context.Context, msg vllmzmq.Message) {
	f.t.Helper()
	restarted := f.seenLive && msg.Seq <= f.lastLive
	f.lastLive, f.seenLive = msg.Seq, true
	switch {
	case restarted:
		f.restarts++
		f.reset()
		f.next = 0
		if msg.Seq > 0 {
			f.fill(ctx)
		}
	case msg.Seq < f.next:
		return // already applied from a replay
	case msg.Seq > f.next:
		f.fill(ctx)
		if msg.Seq < f.next {
			return
		}
	}
	f.apply(msg)
}

// catchUp handles live messages until the follower has applied every batch
// the publisher sent since its last restart (and seen every restart).
func (f *follower) catchUp(p *vllmzmq.Publisher) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for f.next != p.NextSeq() || uint64(f.restarts) != p.Stats().Restarts {
		msg, err := f.sub.Recv(ctx)
		if err != nil {
			f.t.Fatalf("%v: at seq %d of %d: %v (publisher %+v)", f.key, f.next, p.NextSeq(), err, p.Stats())
		}
		f.handle(ctx, msg)
	}
}

// vllmWorkload submits n requests over a shared 160-token prefix (so
// blocks are shared and evicted) and runs the engine idle.
func vllmWorkload(t testing.TB, e *Engine, rng *rand.Rand, n, ranks int) {
	t.Helper()
	shared := seq(1, 160)
	for i := 0; i < n; i++ {
		tok := cat(shared[:rng.IntN(160)], seq(rng.IntN(1<<20), rng.IntN(80)+1))
		if _, err := e.Submit(context.Background(), Request{Tokens: tok, MaxTokens: rng.IntN(20) + 1, Rank: uint32(rng.IntN(ranks))}); err != nil && !errors.Is(err, ErrTooLong) {
			t.Fatal(err)
		}
		if i%4 == 3 {
			runIdle(t, e)
		}
	}
	runIdle(t, e)
}

// TestVLLMEventsConverge: a ZMQ subscriber receives every batch, the vLLM
// decoder decodes every payload, and the converted events applied to a
// fresh mirror equal the engine's Dump after a workload with evictions,
// after a Reset, and after a Restart (seq back to 0, detected as a restart).
func TestVLLMEventsConverge(t *testing.T) {
	for _, ranks := range []int{1, 2} {
		t.Run(strconv.Itoa(ranks)+" ranks", func(t *testing.T) {
			v := newVLLMEvents(t, vllmTestConfig(10_000), ranks)
			e, _, _ := newTestEngine(t, Config{Worker: "vw", Ranks: ranks, KVBlocks: 48, MaxBatchedTokens: 96, NewEmitter: v.Factory()})
			m := newMirror(t)
			var fs []*follower
			for r, k := range e.Keys() {
				fs = append(fs, newFollower(t, k, v.Publisher(r), m))
			}
			for r := range fs {
				waitSubscribed(t, v.Publisher(r))
			}
			converge := func(what string) {
				t.Helper()
				for r, f := range fs {
					f.catchUp(v.Publisher(r))
				}
				for k, want := range e.Dump() {
					if got := m.seqs(k); !slices.Equal(got, want) {
						t.Fatalf("%s: %v holds %d blocks by its events, engine %d", what, k, len(got), len(want))
					}
				}
			}
			rng := rand.New(rand.NewPCG(21, 22))
			vllmWorkload(t, e, rng, 80, ranks)
			converge("after workload")
			if err := e.Reset(); err != nil {
				t.Fatal(err)
			}
			vllmWorkload(t, e, rng, 40, ranks)
			converge("after reset")
			if err := e.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
			vllmWorkload(t, e, rng, 40, ranks)
			converge("after restart")

			var removed uint64
			for r, st := range e.Stats() {
				removed += st.RemovedBlocks
				if st.EmitErrors != 0 {
					t.Fatalf("rank %d: %d emit errors, last %v", r, st.EmitErrors, st.LastEmitError)
				}
				if fs[r].restarts != 1 {
					t.Fatalf("rank %d: follower saw %d restarts, want 1", r, fs[r].restarts)
				}
				if st := v.Publisher(r).Stats(); st.SendErrors != 0 || st.Restarts != 1 {
					t.Fatalf("rank %d publisher %+v", r, st)
				}
			}
			if removed == 0 {
				t.Fatal("workload never evicted")
			}
		})
	}
}

func waitSubscribed(t testing.TB, p *vllmzmq.Publisher) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool { return len(p.Subscriptions()) > 0 },
		func() string { return "no subscriber reached " + p.Endpoint() })
}

// TestVLLMEventsLoRA: a request's adapter travels as lora_name (and in
// extra_keys), so the converter seeds its hashes as the engine did: the same
// tokens under two adapters are two different cached prefixes, and the view
// built from events equals the Dump.
func TestVLLMEventsLoRA(t *testing.T) {
	v := newVLLMEvents(t, vllmTestConfig(100), 1)
	e, _, _ := newTestEngine(t, Config{NewEmitter: v.Factory()})
	p := v.Publisher(0)
	f := newFollower(t, e.Keys()[0], p, newMirror(t))
	waitSubscribed(t, p)
	for _, lora := range []string{"", "adapter-a", "adapter-b"} {
		submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 1, LoRA: lora})
		runIdle(t, e)
	}
	f.catchUp(p)
	key := e.Keys()[0]
	if got, want := f.m.seqs(key), e.Dump()[key]; !slices.Equal(got, want) || len(want) != 12 {
		t.Fatalf("view %d blocks, engine %d (want 3 adapters x 4 blocks)", len(got), len(want))
	}
	res, err := vllmzmq.Replay(context.Background(), p.ReplayEndpoint(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var vb vllm.Batch
	for _, b := range res.Batches {
		if err := vllm.DecodeBatch(b.Payload, &vb); err != nil {
			t.Fatal(err)
		}
		for _, ev := range vb.Events {
			if ev.Kind == kvevents.KindStored {
				names = append(names, ev.LoraName)
			}
		}
	}
	if !slices.Equal(names, []string{"", "adapter-a", "adapter-b"}) {
		t.Fatalf("lora_name of the stored events %q", names)
	}
}

// TestVLLMEventsOneBatchPerStep: the events of one engine step travel as
// one batch (one seq), in the order the engine emitted them, and idle
// steps publish nothing.
func TestVLLMEventsOneBatchPerStep(t *testing.T) {
	v := newVLLMEvents(t, vllmTestConfig(100), 1)
	e, _, _ := newTestEngine(t, Config{KVBlocks: 64, MaxBatchedTokens: 64, NewEmitter: v.Factory()})
	p := v.Publisher(0)
	submit(t, e, Request{ID: "a", Tokens: seq(0, 100), MaxTokens: 1})
	c := e.ranks[0]
	var batches []int
	for {
		did, err := c.stepOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !did {
			break
		}
		batches = append(batches, int(p.NextSeq()))
	}
	// 100 prompt tokens in chunks of 64: step 1 stores 4 blocks, step 2
	// stores 2 more (and samples the token): two steps, two batches.
	if !slices.Equal(batches, []int{1, 2}) {
		t.Fatalf("seqs after each step %v, want [1 2]", batches)
	}
	res, err := vllmzmq.Replay(context.Background(), p.ReplayEndpoint(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var vb vllm.Batch
	var blocks []int
	for _, b := range res.Batches {
		if err := vllm.DecodeBatch(b.Payload, &vb); err != nil {
			t.Fatal(err)
		}
		for _, ev := range vb.Events {
			if ev.Kind != kvevents.KindStored || ev.BlockSize != DefaultBlockSize || ev.Medium != "GPU" || len(ev.TokenIDs) != len(ev.BlockHashes)*DefaultBlockSize {
				t.Fatalf("event %+v", ev)
			}
			blocks = append(blocks, len(ev.BlockHashes))
		}
	}
	if !slices.Equal(blocks, []int{4, 2}) {
		t.Fatalf("stored blocks per batch %v, want [4 2]", blocks)
	}
	if st := e.Stats()[0]; st.StoredBlocks != 6 {
		t.Fatalf("engine stored %d blocks", st.StoredBlocks)
	}
}

// TestVLLMEventsLateJoiner: a subscriber that joins after the engine ran
// gets everything from seq 0 through the replay socket, in order, and ends
// up equal to the Dump; with a buffer smaller than the history the replay
// starts later than asked and ReplayResult.Late says so, which is how a
// client knows it must rebuild the rank rather than trust what it has.
func TestVLLMEventsLateJoiner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Run("everything from seq 0", func(t *testing.T) {
		v := newVLLMEvents(t, vllmTestConfig(10_000), 1)
		e, _, _ := newTestEngine(t, Config{KVBlocks: 48, MaxBatchedTokens: 96, NewEmitter: v.Factory()})
		rng := rand.New(rand.NewPCG(5, 6))
		vllmWorkload(t, e, rng, 60, 1)
		p := v.Publisher(0)
		m := newMirror(t)
		f := newFollower(t, e.Keys()[0], p, m)
		waitSubscribed(t, p)
		sent := p.NextSeq()
		res, err := vllmzmq.Replay(ctx, p.ReplayEndpoint(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.Late || uint64(len(res.Batches)) != sent {
			t.Fatalf("replay of %d batches (late %v), published %d", len(res.Batches), res.Late, sent)
		}
		for i, b := range res.Batches {
			if b.Seq != uint64(i) || b.Topic != "kv@sim@m" {
				t.Fatalf("replayed batch %d: seq %d topic %q", i, b.Seq, b.Topic)
			}
			f.apply(b)
		}
		// Live messages continue where the replay ended.
		vllmWorkload(t, e, rng, 20, 1)
		f.catchUp(p)
		if got, want := m.seqs(e.Keys()[0]), e.Dump()[e.Keys()[0]]; !slices.Equal(got, want) {
			t.Fatalf("late joiner holds %d blocks, engine %d", len(got), len(want))
		}
		if f.replays != 0 || f.applied != int(p.NextSeq()) {
			t.Fatalf("follower applied %d of %d, %d extra replays", f.applied, p.NextSeq(), f.replays)
		}
	})
	t.Run("older than the buffer", func(t *testing.T) {
		v := newVLLMEvents(t, vllmTestConfig(8), 1)
		e, _, _ := newTestEngine(t, Config{KVBlocks: 48, MaxBatchedTokens: 96, NewEmitter: v.Factory()})
		vllmWorkload(t, e, rand.New(rand.NewPCG(7, 8)), 40, 1)
		p := v.Publisher(0)
		sent := p.NextSeq()
		if sent <= 8 {
			t.Fatalf("only %d batches: the buffer never overflowed", sent)
		}
		res, err := vllmzmq.Replay(ctx, p.ReplayEndpoint(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Late || len(res.Batches) != 8 || res.Batches[0].Seq != sent-8 {
			t.Fatalf("replay from 0 with %d sent: late %v, %d batches from %d", sent, res.Late, len(res.Batches), res.Batches[0].Seq)
		}
		// What the late replay holds cannot rebuild the cache: applied to
		// an empty view it refers to blocks the view never heard of (or
		// misses blocks), which is why Late means "clear and rebuild".
		m := newMirror(t)
		conv, _ := vllm.NewConverter(vllm.ConverterConfig{BlockSize: DefaultBlockSize})
		var vb vllm.Batch
		var out []kvevents.Event
		broken := false
		for _, b := range res.Batches {
			if err := vllm.DecodeBatch(b.Payload, &vb); err != nil {
				t.Fatal(err)
			}
			out, err = conv.Convert(&vb, out[:0])
			if err != nil || m.applyErr(e.Keys()[0], out) != nil {
				broken = true
			}
		}
		if !broken && slices.Equal(m.seqs(e.Keys()[0]), e.Dump()[e.Keys()[0]]) {
			t.Fatal("a partial replay rebuilt the cache exactly: the workload does not show the loss")
		}
	})
}

// TestVLLMEventsDataParallelPorts: rank r publishes on the endpoint's port
// + r and answers replays on the replay port + r, and stamps its rank in
// every batch.
func TestVLLMEventsDataParallelPorts(t *testing.T) {
	base := testutil.FreePorts(t, 4)
	cfg := vllmTestConfig(100)
	cfg.Endpoint = fmt.Sprintf("tcp://*:%d", base)
	cfg.ReplayEndpoint = fmt.Sprintf("tcp://*:%d", base+2)
	v := newVLLMEvents(t, cfg, 2)
	e, _, _ := newTestEngine(t, Config{Ranks: 2, NewEmitter: v.Factory()})
	for r := 0; r < 2; r++ {
		p := v.Publisher(r)
		if want := fmt.Sprintf(":%d", base+r); !strings.HasSuffix(p.Endpoint(), want) {
			t.Fatalf("rank %d publishes on %s, want port %d", r, p.Endpoint(), base+r)
		}
		if want := fmt.Sprintf(":%d", base+2+r); !strings.HasSuffix(p.ReplayEndpoint(), want) {
			t.Fatalf("rank %d replays on %s, want port %d", r, p.ReplayEndpoint(), base+2+r)
		}
		sub, err := vllmzmq.NewSubscriber(vllmzmq.SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+r)})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		waitSubscribed(t, p)
		submit(t, e, Request{Tokens: seq(r*1000, 40), MaxTokens: 2, Rank: uint32(r)})
		runIdle(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		msg, err := sub.Recv(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var vb vllm.Batch
		if err := vllm.DecodeBatch(msg.Payload, &vb); err != nil {
			t.Fatal(err)
		}
		if vb.DPRank != int64(r) || msg.Seq != 0 || len(vb.Events) == 0 {
			t.Fatalf("rank %d: seq %d batch of rank %d with %d events", r, msg.Seq, vb.DPRank, len(vb.Events))
		}
	}
}

func TestVLLMEventsDisabledAndErrors(t *testing.T) {
	v, err := NewVLLMEvents(vllmzmq.DefaultConfig(), 2, nil)
	if err != nil || v.Enabled() || v.Publisher(0) != nil {
		t.Fatalf("disabled: %v enabled %v", err, v.Enabled())
	}
	em, err := v.Factory()(1, 7)
	if _, ok := em.(DiscardEmitter); !ok || err != nil {
		t.Fatalf("disabled factory gave %T, %v", em, err)
	}
	bad := vllmTestConfig(10)
	bad.Publisher = "kafka"
	if _, err := NewVLLMEvents(bad, 1, nil); !errors.Is(err, vllmzmq.ErrBadConfig) {
		t.Fatalf("unknown publisher: %v", err)
	}
	if _, err := NewVLLMEvents(vllmTestConfig(10), 0, nil); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("zero ranks: %v", err)
	}
	on := newVLLMEvents(t, vllmTestConfig(10), 1)
	if _, err := on.Factory()(1, 1); !errors.Is(err, ErrBadRank) {
		t.Fatalf("rank beyond the publishers: %v", err)
	}
	// Reannounce has no tokens: it publishes nothing over ZMQ (a lone
	// AllBlocksCleared would wipe the subscribers' view).
	e, _, _ := newTestEngine(t, Config{NewEmitter: on.Factory()})
	submit(t, e, Request{Tokens: seq(0, 40), MaxTokens: 1})
	runIdle(t, e)
	before := on.Publisher(0).NextSeq()
	e.Reannounce()
	if st := e.Stats()[0]; st.EmitErrors != 0 || on.Publisher(0).NextSeq() != before || before == 0 {
		t.Fatalf("reannounce through vLLM events: %d errors (last %v), seq %d -> %d", st.EmitErrors, st.LastEmitError, before, on.Publisher(0).NextSeq())
	}
	// A Stored event without tokens cannot become a BlockStored.
	em, _ = on.Factory()(0, 1)
	if err := em.Emit(kvevents.Event{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 1}}}); !errors.Is(err, ErrNoTokens) {
		t.Fatalf("Stored through Emit: %v", err)
	}
}

// BenchmarkVLLMEventsEngineCPU measures a loaded engine's CPU (user+system,
// every goroutine of the process, as cpu-ns/op) on a prefill-heavy workload
// with evictions, without events and with vLLM events over ZMQ, with no
// subscriber and with one draining subscriber (whose CPU is counted too).
// The budget is +5 % for publishing.
func BenchmarkVLLMEventsEngineCPU(b *testing.B) {
	for _, mode := range []string{"discard", "vllm-zmq", "vllm-zmq-subscribed"} {
		b.Run(mode, func(b *testing.B) {
			cfg := Config{KVBlocks: 2048, MaxBatchedTokens: 2048, NewEmitter: func(uint32, uint64) (EventEmitter, error) { return DiscardEmitter{}, nil }}
			var v *VLLMEvents
			if mode != "discard" {
				v = newVLLMEvents(b, vllmTestConfig(10_000), 1)
				cfg.NewEmitter = v.Factory()
			}
			e, _, _ := newTestEngine(b, cfg)
			if mode == "vllm-zmq-subscribed" {
				sub, err := vllmzmq.NewSubscriber(vllmzmq.SubscriberConfig{Endpoint: v.Publisher(0).Endpoint()})
				if err != nil {
					b.Fatal(err)
				}
				waitSubscribed(b, v.Publisher(0))
				ctx, stop := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					for {
						if _, err := sub.Recv(ctx); err != nil {
							return
						}
					}
				}()
				defer func() { stop(); <-done; sub.Close() }()
			}
			rng := rand.New(rand.NewPCG(1, 2))
			shared := seq(1, 1024)
			prompt := make([]uint32, 0, 2048)
			ctx := context.Background()
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				for i := 0; i < 8; i++ {
					prompt = append(cat(prompt[:0], shared[:rng.IntN(1024)]), seq(rng.IntN(1<<30), 256+rng.IntN(512))...)
					if _, err := e.Submit(ctx, Request{Tokens: prompt, MaxTokens: 16}); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.RunUntilIdle(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
			if v != nil {
				b.ReportMetric(float64(v.Publisher(0).Stats().Published)/float64(b.N), "batches/op")
			}
		})
	}
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkVLLMEventsServingCPU measures the process CPU per completed
// request of an engine serving as `kvrouter sim serve` runs it: Run on the
// wall clock at the replay's speed-up (10), 64 clients each submitting a
// small prompt (a 256-token shared system prompt of one of 32 conversations
// plus 64 new tokens) for 16 output tokens and draining its stream, a cache
// small enough to evict. Without events and with vLLM events over ZMQ (no
// subscriber). The budget is +5 % CPU for publishing.
func BenchmarkVLLMEventsServingCPU(b *testing.B) {
	for _, mode := range []string{"discard", "vllm-zmq"} {
		b.Run(mode, func(b *testing.B) {
			cfg := Config{Worker: "bench", Model: "m", KVBlocks: 4096, Speedup: 10, Clock: WallClock{},
				NewEmitter: func(uint32, uint64) (EventEmitter, error) { return DiscardEmitter{}, nil }}
			var v *VLLMEvents
			var inEvents atomic.Int64 // ns spent inside the vLLM emitter
			if mode != "discard" {
				v = newVLLMEvents(b, vllmTestConfig(10_000), 1)
				mk := v.Factory()
				cfg.NewEmitter = func(rank uint32, epoch uint64) (EventEmitter, error) {
					em, err := mk(rank, epoch)
					if err != nil {
						return nil, err
					}
					return &timedEmitter{em: em.(*vllmEmitter), ns: &inEvents}, nil
				}
			}
			e, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- e.Run(ctx) }()
			defer func() {
				stop()
				<-ran
				e.Close(context.Background())
			}()
			var next atomic.Int64
			systems := make([][]uint32, 32)
			for i := range systems {
				systems[i] = seq(i*100_000, 256)
			}
			b.ReportAllocs()
			start, t0 := cpuTime(), time.Now()
			var wg sync.WaitGroup
			for c := 0; c < 64; c++ {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(c), 9))
					for next.Add(1) <= int64(b.N) {
						prompt := cat(systems[rng.IntN(len(systems))], seq(rng.IntN(1<<30), 64))
						st, err := e.Submit(ctx, Request{Tokens: prompt, MaxTokens: 16})
						if err != nil {
							b.Error(err)
							return
						}
						if res, err := st.Wait(ctx); err != nil || res.OutputTokens != 16 {
							b.Errorf("request: %+v, %v", res, err)
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(t0)
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
			if v != nil {
				b.ReportMetric(float64(v.Publisher(0).Stats().Published)/float64(b.N), "batches/op")
				b.ReportMetric(float64(inEvents.Load())/float64(b.N), "events-ns/op")
			}
		})
	}
}

// timedEmitter adds up the time the engine spends inside a vLLM emitter
// (encoding and publishing; the engine calls it from its step loop, so this
// is CPU time unless the thread is preempted), for the serving benchmark.
type timedEmitter struct {
	em *vllmEmitter
	ns *atomic.Int64
}

func (t *timedEmitter) Emit(ev kvevents.Event) error {
	start := time.Now()
	err := t.em.Emit(ev)
	t.ns.Add(int64(time.Since(start)))
	return err
}

func (t *timedEmitter) EmitStored(ev kvevents.Event, tokens []uint32, keys BlockKeys) error {
	start := time.Now()
	err := t.em.EmitStored(ev, tokens, keys)
	t.ns.Add(int64(time.Since(start)))
	return err
}

func (t *timedEmitter) EndStep() error {
	start := time.Now()
	err := t.em.EndStep()
	t.ns.Add(int64(time.Since(start)))
	return err
}

func (t *timedEmitter) Close(ctx context.Context) error { return t.em.Close(ctx) }
