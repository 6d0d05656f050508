package bridge

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

// benchEngine is a bare vLLM event publisher (rank 0, replay on) and a rank
// following it into a fresh JetStream stream, the bridge's hot path with no
// HTTP around it.
type benchEngine struct {
	zpub *vllmzmq.Publisher
	r    *rank
	stop func()
}

func newBenchEngine(tb testing.TB, f *fleet, worker string) *benchEngine {
	tb.Helper()
	ec := vllmzmq.DefaultConfig()
	ec.EnableKVCacheEvents, ec.Endpoint, ec.ReplayEndpoint = true, "tcp://*:0", "tcp://*:0"
	zpub, err := vllmzmq.NewPublisher(ec, 0, nil)
	if err != nil {
		tb.Fatal(err)
	}
	sub, err := vllmzmq.NewSubscriber(vllmzmq.SubscriberConfig{Endpoint: zpub.Endpoint(), Buffer: 8192})
	if err != nil {
		tb.Fatal(err)
	}
	br := &Bridge{cfg: Config{ReplayTimeout: 5 * time.Second}, met: newMetrics(false), log: quiet}
	cc, pc := Config{Model: testModel, WorkerID: worker,
		Events: kvevents.PublisherConfig{MaxDelay: benchMaxDelay, BufferEvents: 1 << 20}}.rankEvents(testBlock, 0)
	pub, err := kvevents.NewPublisher(f.js, pc)
	if err != nil {
		tb.Fatal(err)
	}
	conv, _ := vllm.NewConverter(cc)
	r := &rank{b: br, label: "0", replay: zpub.ReplayEndpoint(), sub: sub, pub: pub, conv: conv, conv0: cc, log: quiet}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.run(ctx) }()
	be := &benchEngine{zpub: zpub, r: r}
	be.stop = func() {
		cancel()
		sub.Close()
		<-done
		pub.Close(context.Background())
		zpub.Close()
	}
	// Wait for the SUB to be connected: publish until one arrives.
	for i := 0; counter(br, "batches_total") == 0; i++ {
		if i > 5000 {
			tb.Fatal("the subscriber never connected")
		}
		zpub.Publish(encode(tb, []any{1.7e9, []any{[]any{"AllBlocksCleared"}}, 0}))
		time.Sleep(time.Millisecond)
	}
	return be
}

// storedEvent is a positional BlockStored of 16 blocks starting at hash h.
func storedEvent(h uint64) ([]any, []uint32) {
	hashes := make([]uint64, 16)
	toks := make([]uint32, 16*testBlock)
	for i := range hashes {
		hashes[i] = h + uint64(i)
	}
	for i := range toks {
		toks[i] = uint32(h)*7 + uint32(i)
	}
	return []any{"BlockStored", hashes, nil, toks, testBlock, nil, "GPU"}, toks
}

// BenchmarkRelay: block events per second from ZMQ into JetStream (the
// target is 200,000 with 16 blocks per event). Each batch stores 4 events
// of 16 blocks and removes the 4 events of the batch before, so the
// converter's table stays the size of a cache.
func BenchmarkRelay(b *testing.B) {
	f := newFleet(b)
	be := newBenchEngine(b, f, "bench")
	defer be.stop()
	const ring, perBatch = 64, 4
	payloads := make([][]byte, ring)
	for i := range ring {
		var evs []any
		for j := range perBatch {
			ev, _ := storedEvent(uint64((i*perBatch+j)*16 + 1))
			evs = append(evs, ev)
		}
		prev := (i + ring - 1) % ring
		for j := range perBatch {
			hs := make([]uint64, 16)
			for k := range hs {
				hs[k] = uint64((prev*perBatch+j)*16+1) + uint64(k)
			}
			evs = append(evs, []any{"BlockRemoved", hs, "GPU"})
		}
		payloads[i] = encode(b, []any{1.7e9, evs, 0})
	}
	// Store what the first batch removes: a sequence-keyed converter drops
	// the removal of a block it never saw stored, and every removal must
	// publish an event for the count below.
	var warm []any
	for j := range perBatch {
		ev, _ := storedEvent(uint64(((ring-1)*perBatch+j)*16 + 1))
		warm = append(warm, ev)
	}
	base := be.r.pub.Stats().Published + perBatch
	be.zpub.Publish(encode(b, []any{1.7e9, warm, 0}))
	for wait := time.Now(); be.r.pub.Stats().Published < base; time.Sleep(100 * time.Microsecond) {
		if time.Since(wait) > 10*time.Second {
			b.Fatal("the warm-up batch was not published")
		}
	}
	start := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		be.zpub.Publish(payloads[i%ring])
	}
	want := base + uint64(b.N*perBatch*2)
	for be.r.pub.Stats().Published < want {
		time.Sleep(100 * time.Microsecond)
		if time.Since(start) > time.Minute {
			b.Fatalf("published %d of %d events", be.r.pub.Stats().Published-base, want-base)
		}
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N*perBatch*2*16)/el.Seconds(), "blocks/s")
	b.ReportMetric(float64(b.N*perBatch*2)/el.Seconds(), "events/s")
}

// latencySink records when each first block's sequence hash reaches the
// index side.
type latencySink struct {
	mu sync.Mutex
	at map[kvevents.SeqHash]time.Time
}

func (s *latencySink) ApplyBatch(_ uint64, b *kvevents.Batch) {
	t := time.Now()
	s.mu.Lock()
	for _, ev := range b.Events {
		if ev.Kind == kvevents.KindStored && len(ev.Blocks) > 0 {
			s.at[ev.Blocks[0].Seq] = t
		}
	}
	s.mu.Unlock()
}
func (s *latencySink) Resync(kvevents.Signal) {}

// BenchmarkEndToEndLatency: engine publish -> router index applied, at
// 10,000 events (BlockStored of 16 blocks, each also removing the blocks of
// the event before it, so the cache stays steady) per second, for 2 s per
// iteration; reports p50 and p99 in ms (targets 2 and 10). events-per-batch
// is how many events one engine step publishes at once: 1 (10,000 ZMQ
// messages/s) or 10 (a step every millisecond).
func BenchmarkEndToEndLatency(b *testing.B) {
	for _, step := range []int{1, 10} {
		b.Run("events-per-batch="+strconv.Itoa(step), func(b *testing.B) { benchLatency(b, step) })
	}
}

func benchLatency(b *testing.B, step int) {
	f := newFleet(b)
	be := newBenchEngine(b, f, "lat")
	defer be.stop()
	sink := &latencySink{at: map[kvevents.SeqHash]time.Time{}}
	sub, err := kvevents.NewSubscriber(f.js, kvevents.SubscriberConfig{Sink: sink, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); sub.Run(ctx) }()
	defer func() { cancel(); <-done }()
	const rate, window = 10_000, 2 * time.Second
	n := int(rate * window.Seconds())
	batches := n / step
	seed := kvevents.SeedFor("", "")
	var lat []time.Duration
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		payloads := make([][]byte, batches)
		firsts := make([]kvevents.SeqHash, n)
		for bi := range batches {
			var evs []any
			for k := range step {
				i := bi*step + k
				h := uint64((it*n+i)*16 + 1)
				ev, toks := storedEvent(h)
				evs = append(evs, ev)
				if i > 0 {
					hs := make([]uint64, 16)
					for x := range hs {
						hs[x] = h - 16 + uint64(x)
					}
					evs = append(evs, []any{"BlockRemoved", hs, "GPU"})
				}
				firsts[i] = kvevents.SeqHashes(nil, toks[:testBlock], testBlock, seed)[0]
			}
			payloads[bi] = encode(b, []any{1.7e9, evs, 0})
		}
		sent := make([]time.Time, batches)
		start := time.Now()
		for bi := range batches {
			due := start.Add(time.Duration(bi*step) * time.Second / rate)
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			sent[bi] = time.Now()
			be.zpub.Publish(payloads[bi])
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			sink.mu.Lock()
			got := len(sink.at)
			sink.mu.Unlock()
			if got >= (it+1)*n || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		sink.mu.Lock()
		for i, h := range firsts {
			if t, ok := sink.at[h]; ok {
				lat = append(lat, t.Sub(sent[i/step]))
			}
		}
		sink.mu.Unlock()
	}
	b.StopTimer()
	if len(lat) == 0 {
		b.Fatal("no event arrived")
	}
	slices.Sort(lat)
	ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / 1e6 }
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(float64(len(lat))/float64(b.N*n)*100, "%-arrived")
}

// BenchmarkIdleCPU: CPU a bridge uses next to an idle engine, with the
// default 250 ms metrics interval and 1 s health checks: the process's CPU
// time over 3 s with the bridge running, minus 3 s of the same process
// without it, as % of one core (target <= 1). The engine's HTTP side is a
// static copy of an idle simulated engine's /metrics page, so that the
// engine's own cost of rendering it is not counted; its ZMQ sockets and the
// NATS server are real (and idle).
func BenchmarkIdleCPU(b *testing.B) {
	for it := 0; it < b.N; it++ {
		f := newFleet(b)
		e := startEngine(b, "idle", engineOpts{})
		resp, err := http.Get(e.srv.URL + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		static := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				w.Write(page)
			}
		}))
		const window = 3 * time.Second
		before := cpuTime()
		time.Sleep(window)
		baseline := cpuTime() - before
		cfg := bridgeCfg(e, "idle")
		cfg.EngineURL = static.URL
		cfg.MetricsInterval, cfg.HealthInterval = DefaultMetricsInterval, DefaultHealthInterval
		br, err := New(cfg, f.nc, f.js)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); br.Run(ctx) }()
		time.Sleep(time.Second) // registration and the first replay
		before = cpuTime()
		time.Sleep(window)
		with := cpuTime() - before
		cancel()
		<-done
		static.Close()
		b.ReportMetric(float64(with-baseline)/float64(window)*100, "%core")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchMaxDelay is the publisher batching delay of the benchmarks: the
// bridge's default (kvrouter bridge --event-max-delay).
const benchMaxDelay = 500 * time.Microsecond
