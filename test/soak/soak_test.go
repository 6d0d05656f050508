package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/telemetry"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoredGoroutines()...)
}

const (
	model     = "m"
	worker    = "w0"
	blockSize = 16
)

// soakBounds are the limits the replica runs under and the bounds the test
// asserts, in one place.
type soakBounds struct {
	// Replica limits.
	MaxInFlight int // host.Config.MaxInFlight: route requests in flight, NATS and HTTP together
	// IndexMaxEntries caps the prefix index (--index-max-entries); the
	// test checks the sampled index size stays under it.
	IndexMaxEntries int64
	// HTTPReadTimeout bounds reading one HTTP request, body included
	// (--http-read-timeout): clients that trickle a body are cut off.
	HTTPReadTimeout time.Duration
	// MaxSessions caps the session bindings (--max-sessions).
	MaxSessions int64

	// ExpectSlowBodyCut: the replica cuts off clients that trickle a body
	// (HTTPReadTimeout is shorter than the run).
	ExpectSlowBodyCut bool

	// Asserted bounds.
	MaxGoroutines int     // sampled during the run (the test process: server, replica, clients)
	MaxRSSBytes   int64   // VmRSS of the test process, sampled during the run
	MinServed     float64 // fraction of good requests answered 200 (the rest may only be 529 or 503)
}

// defaultBounds: generous on purpose. The test process holds the NATS
// server (JetStream store included), the replica, every client and the
// race detector, which multiplies memory several times; 1.5 GiB is far
// above a healthy run (a few hundred MiB under -race) and far below the
// multi-GiB growth of the unbounded cases the issue found.
func defaultBounds() soakBounds {
	return soakBounds{
		MaxInFlight:       1024,
		IndexMaxEntries:   50_000,
		HTTPReadTimeout:   5 * time.Second,
		MaxSessions:       100_000,
		ExpectSlowBodyCut: true,
		MaxGoroutines:     3000,
		MaxRSSBytes:       1536 << 20,
		MinServed:         0.99,
	}
}

// apply sets the replica limits on cfg.
func (b soakBounds) apply(cfg *host.Config) {
	cfg.MaxInFlight = b.MaxInFlight
	cfg.IndexLimits.MaxEntries = b.IndexMaxEntries
	cfg.HTTPReadTimeout = b.HTTPReadTimeout
	cfg.Bindings.MaxSessions = b.MaxSessions
}

// soakDuration is 30 s, or KVR_SOAK_DURATION.
func soakDuration(t *testing.T) time.Duration {
	d := 30 * time.Second
	if v := os.Getenv("KVR_SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("KVR_SOAK_DURATION=%q: want a positive Go duration", v)
		}
	}
	return d
}

// stats counts what the traffic got.
type stats struct {
	goodOK, goodShed, goodFailed atomic.Int64 // good routes: 200, 529/503, anything else
	badSent, badRefused          atomic.Int64 // bad HTTP requests and how many got a 4xx
	badServed                    atomic.Int64 // bad-looking requests that were valid after all (random sessions)
	eventsForged, floodBlocks    atomic.Int64
	slowDropped                  [2]atomic.Int64 // slow clients the server cut off: [0] in the header, [1] in the body
	failures                     sync.Map        // distinct failure texts of good requests
	shedWhy                      sync.Map        // distinct 529/503 answers to good requests
}

func (s *stats) fail(what string) {
	s.goodFailed.Add(1)
	s.failures.LoadOrStore(what, true)
}

// peaks are the largest samples seen.
type peaks struct {
	goroutines        int
	rss, indexEntries int64
	samples           int
	lastIndex         int64
}

type soak struct {
	t       *testing.T
	nc      *nats.Conn
	js      jetstream.JetStream
	rep     *host.Replica
	prom    *telemetry.Prometheus
	base    string // http://addr
	client  *api.Client
	http    *http.Client
	pub     *kvevents.Publisher
	prompts [][]uint32
	st      stats
	pkMu    sync.Mutex
	pk      peaks
}

func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test: not in -short mode")
	}
	b := defaultBounds()
	dur := soakDuration(t)
	s := start(t, b)

	ctx, stop := context.WithTimeout(context.Background(), dur)
	defer stop()
	var wg sync.WaitGroup
	run := func(n int, f func(ctx context.Context, rng *rand.Rand)) {
		for i := 0; i < n; i++ {
			wg.Add(1)
			rng := rand.New(rand.NewPCG(uint64(len(s.prompts)), uint64(i)+1))
			go func() { defer wg.Done(); f(ctx, rng) }()
		}
	}
	run(1, s.sample)
	run(2, s.goodHTTP)
	run(2, s.goodNATS)
	run(1, s.workerCaches)
	run(1, s.malformedHTTP)
	run(1, s.hugeBodies)
	run(1, s.slowClients)
	run(1, s.garbageNATS)
	run(1, s.forgedEvents)
	run(1, s.hashFlood)
	run(1, s.randomSessions)
	wg.Wait()

	s.report(b)
}

func start(t *testing.T, b soakBounds) *soak {
	srv := natstest.Start(t, natstest.WithMaxPayload(8<<20))
	nc, js := natstest.JetStream(t, srv)
	prom, err := telemetry.NewPrometheus(false)
	if err != nil {
		t.Fatal(err)
	}
	cfg := host.Config{
		ReplicaID: "soak", Models: []string{model}, BlockSize: blockSize, HTTPAddr: "127.0.0.1:0",
		// A long registry TTL: on a starved CI machine a late heartbeat must
		// not make the worker depart (that is not what this test is about).
		Registry:       workers.RegistryConfig{TTL: 15 * time.Second, Heartbeat: time.Second, Logger: slog.New(slog.DiscardHandler)},
		Bindings:       bindings.Config{IdleTTL: time.Minute, MarkerTTL: time.Second},
		MetricsHandler: prom.Handler, Telemetry: host.Telemetry{MeterProvider: prom.Provider},
		Logger: slog.New(slog.DiscardHandler),
	}
	b.apply(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := host.New(natstest.Connect(t, srv), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := rep.Close(cctx); err != nil {
			t.Errorf("replica close: %v", err)
		}
		_ = prom.Shutdown(cctx)
	})
	reg, err := workers.Register(ctx, js, cfg.Registry, workers.Info{ID: worker, Model: model, Endpoint: "http://127.0.0.1:1/v1",
		Ranks: []uint32{0}, BlockSize: blockSize, KVBlocks: 1 << 20, MaxBatchedTokens: 1 << 16, MaxSeqs: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	pub, err := kvevents.NewPublisher(js, kvevents.PublisherConfig{Model: model, Worker: worker, MaxDelay: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = pub.Close(cctx)
	})
	s := &soak{t: t, nc: nc, js: js, rep: rep, prom: prom, base: "http://" + rep.HTTPAddr(),
		client: api.NewClient(nc, "", nil), pub: pub,
		http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}}
	t.Cleanup(s.http.CloseIdleConnections)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 64; i++ {
		p := make([]uint32, 512)
		for j := range p {
			p[j] = uint32(rng.IntN(50_000))
		}
		s.prompts = append(s.prompts, p)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		w, err := rep.Workers(model)
		return err == nil && len(w.Workers) == 1
	}, func() string { return "the replica does not see the worker" })
	return s
}

// prompt is one of the shared prefixes plus a short random tail.
func (s *soak) prompt(rng *rand.Rand) []uint32 {
	p := append([]uint32(nil), s.prompts[rng.IntN(len(s.prompts))]...)
	for i := 0; i < 1+rng.IntN(40); i++ {
		p = append(p, uint32(rng.IntN(50_000)))
	}
	return p
}

// goodHTTP routes good requests over HTTP and frees them.
func (s *soak) goodHTTP(ctx context.Context, rng *rand.Rand) {
	for n := 0; ctx.Err() == nil; n++ {
		req := api.RouteRequest{Model: model, TokenIDs: s.prompt(rng), ExpectedOutputTokens: 64}
		if n%3 == 0 {
			req.SessionID = fmt.Sprintf("good-%d", rng.IntN(32))
		}
		body, _ := json.Marshal(&req)
		code, out, err := s.do(ctx, http.MethodPost, "/v1/route", body)
		if ctx.Err() != nil {
			return
		}
		var resp api.RouteResponse
		if !s.judge(code, err, out, &resp) {
			continue
		}
		q := fmt.Sprintf("/v1/requests/%s?model=%s&attempt=%d&replica=%s&fence=%s", resp.RequestID, model, resp.Attempt, resp.Replica, url.QueryEscape(resp.Fence))
		if code, out, err := s.do(context.WithoutCancel(ctx), http.MethodDelete, q, nil); err != nil || code != http.StatusOK {
			s.st.fail(fmt.Sprintf("free over HTTP: %d %v %.200s", code, err, out))
		}
	}
}

// goodNATS routes good requests over the NATS API and frees them.
func (s *soak) goodNATS(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := s.client.Route(rctx, &api.RouteRequest{Model: model, TokenIDs: s.prompt(rng), ExpectedOutputTokens: 64})
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if ae := (*api.Error)(nil); errors.As(err, &ae) && (ae.Status == http.StatusServiceUnavailable || ae.Status == 529) {
				s.st.goodShed.Add(1)
			} else {
				s.st.fail("route over NATS: " + err.Error())
			}
			continue
		}
		s.st.goodOK.Add(1)
		fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.client.Free(fctx, model, resp); err != nil {
			s.st.fail("free over NATS: " + err.Error())
		}
		cancel()
	}
}

// judge counts a good request's answer and decodes a 200 into resp.
func (s *soak) judge(code int, err error, out []byte, resp *api.RouteResponse) bool {
	switch {
	case err != nil:
		s.st.fail("route over HTTP: " + err.Error())
	case code == http.StatusOK:
		if err := json.Unmarshal(out, resp); err != nil {
			s.st.fail("route reply: " + err.Error())
			return false
		}
		s.st.goodOK.Add(1)
		return true
	case code == 529 || code == http.StatusServiceUnavailable:
		s.st.goodShed.Add(1)
		s.st.shedWhy.LoadOrStore(fmt.Sprintf("%d %.120s", code, out), true)
	default:
		s.st.fail(fmt.Sprintf("route over HTTP: %d %.200s", code, out))
	}
	return false
}

func (s *soak) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	q, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	resp, err := s.http.Do(q)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, out, err
}

// workerCaches: the worker stores the shared prefixes, so good routes find
// overlap (and the index has honest entries next to the flood's).
func (s *soak) workerCaches(ctx context.Context, rng *rand.Rand) {
	seed := kvevents.SeedFor("", "")
	for i := 0; ctx.Err() == nil; i++ {
		p := s.prompts[i%len(s.prompts)]
		hs := kvevents.SeqHashes(nil, p, blockSize, seed)
		blocks := make([]kvevents.StoredBlock, len(hs))
		for j, h := range hs {
			blocks[j] = kvevents.StoredBlock{Engine: kvevents.EngineHash(uint64(i%len(s.prompts))<<32 | uint64(j)), Seq: h}
		}
		_ = s.pub.Emit(kvevents.Event{Kind: kvevents.KindStored, Blocks: blocks})
		sleep(ctx, 50*time.Millisecond)
	}
}

// malformedHTTP: broken JSON, wrong types, over-long ids, unknown paths.
func (s *soak) malformedHTTP(ctx context.Context, rng *rand.Rand) {
	long := strings.Repeat("x", 70_000)
	bodies := []string{
		`{`, `{"model":`, `[]`, `null`, `{"model":"m","token_ids":"abc"}`, `{"model":"m","token_ids":[-1]}`,
		`{"v":2,"model":"m","token_ids":[1]}`, `{"model":"nope","token_ids":[1,2,3]}`,
		`{"model":"m","token_ids":[1],"request_id":"` + long + `"}`,
		`{"model":"m","token_ids":[1],"session_id":"` + long + `"}`,
		`{"model":"m","token_ids":[1],"allowed_workers":[]}`, "\x00\xff\xfe garbage",
	}
	for ctx.Err() == nil {
		b := bodies[rng.IntN(len(bodies))]
		path := "/v1/route"
		if rng.IntN(8) == 0 {
			path = "/v1/requests/" + long[:rng.IntN(4000)+1]
		}
		code, _, err := s.do(ctx, http.MethodPost, path, []byte(b))
		s.badAnswer(ctx, code, err)
	}
}

func (s *soak) badAnswer(ctx context.Context, code int, err error) {
	if ctx.Err() != nil {
		return
	}
	s.st.badSent.Add(1)
	if err == nil && code >= 400 && code < 500 {
		s.st.badRefused.Add(1)
	}
}

// hugeBodies: route bodies past the 16 MiB limit, streamed (the client
// holds nothing), two at a time, each pair a second apart.
func (s *soak) hugeBodies(ctx context.Context, _ *rand.Rand) {
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				body := io.MultiReader(strings.NewReader(`{"model":"m","token_ids":[`),
					io.LimitReader(repeat("1,"), api.MaxRouteBodySize+1<<20), strings.NewReader(`1]}`))
				q, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/route", body)
				resp, err := s.http.Do(q)
				code := 0
				if err == nil {
					code = resp.StatusCode
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				s.badAnswer(ctx, code, err)
				sleep(ctx, time.Second)
			}
		}()
	}
	wg.Wait()
}

type repeatReader string

func repeat(s string) io.Reader { return repeatReader(s) }

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = r[i%len(r)]
	}
	return len(p) - len(p)%len(r), nil
}

// slowClients: connections that trickle a request header or body one byte
// at a time, 32 at once, each replaced when the server drops it.
func (s *soak) slowClients(ctx context.Context, _ *rand.Rand) {
	addr := strings.TrimPrefix(s.base, "http://")
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				s.slowOne(ctx, addr, i%2 == 0)
			}
		}()
	}
	wg.Wait()
}

func (s *soak) slowOne(ctx context.Context, addr string, inBody bool) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		sleep(ctx, 100*time.Millisecond)
		return
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	msg := "POST /v1/route HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nX-Slow: " + strings.Repeat("a", 64) + "\r\n"
	if inBody {
		head := "POST /v1/route HTTP/1.1\r\nHost: soak\r\nContent-Length: 100000\r\n\r\n"
		if _, err := c.Write([]byte(head)); err != nil {
			return
		}
		msg = strings.Repeat("{", 100000)
	}
	part := 0
	if inBody {
		part = 1
	}
	for i := 0; i < len(msg) && ctx.Err() == nil; i++ {
		if _, err := c.Write([]byte{msg[i]}); err != nil {
			if ctx.Err() == nil {
				s.st.slowDropped[part].Add(1) // the server gave up on us: what a bound looks like
			}
			return
		}
		sleep(ctx, 500*time.Millisecond)
	}
	_, _ = bufio.NewReader(c).ReadString('\n')
}

// garbageNATS: malformed route, lifecycle and session requests over NATS.
func (s *soak) garbageNATS(ctx context.Context, rng *rand.Rand) {
	subjects := []string{api.RouteSubject("", model), api.LifecycleSubject("", api.OpFree, model),
		api.SessionGetSubject("", model), api.WorkersSubject("", model), api.BookingsSubject("", model),
		api.DecisionsSubject("", model), workers.LoadSubject("", model, "ghost")}
	payloads := [][]byte{[]byte("{"), []byte(`{"model":1}`), make([]byte, 64<<10), []byte(`{"v":1,"replica":"x","events":[{"kind":"add"}]}`),
		[]byte("KVRD\x01\x00\xff\xff"), []byte(`{"model":"m","worker":"ghost","at":"bad"}`)}
	for ctx.Err() == nil {
		subj := subjects[rng.IntN(len(subjects))]
		p := payloads[rng.IntN(len(payloads))]
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = s.nc.RequestWithContext(rctx, subj, p)
		cancel()
		s.st.badSent.Add(1)
		sleep(ctx, 10*time.Millisecond)
	}
}

// forgedEvents: garbage on the worker's event subject, well-formed batches
// naming another worker than their subject, and batches from workers that
// never registered (ghosts), each with unique hashes.
func (s *soak) forgedEvents(ctx context.Context, rng *rand.Rand) {
	subj := kvevents.EventSubject("", model, worker)
	for i := 0; ctx.Err() == nil; i++ {
		var data []byte
		target := subj
		switch i % 3 {
		case 0:
			data = make([]byte, 1+rng.IntN(2048))
			for j := range data {
				data[j] = byte(rng.UintN(256))
			}
		case 1: // names w0 on a ghost's subject
			target = kvevents.EventSubject("", model, fmt.Sprintf("ghost-%d", rng.IntN(4)))
			data = s.batch(rng, worker, uint64(i+1))
		case 2: // a ghost speaking for itself
			g := fmt.Sprintf("ghost-%d", rng.IntN(4))
			target = kvevents.EventSubject("", model, g)
			data = s.batch(rng, g, uint64(i+1))
		}
		_, _ = s.js.Publish(ctx, target, data)
		s.st.eventsForged.Add(1)
		sleep(ctx, 10*time.Millisecond)
	}
}

// batch is a well-formed batch of one Stored event with 32 unique blocks.
func (s *soak) batch(rng *rand.Rand, w string, id uint64) []byte {
	blocks := make([]kvevents.StoredBlock, 32)
	for j := range blocks {
		blocks[j] = kvevents.StoredBlock{Engine: kvevents.EngineHash(rng.Uint64()), Seq: kvevents.SeqHash(rng.Uint64())}
	}
	b := kvevents.Batch{Model: model, Worker: w, Epoch: 42, FirstEventID: id,
		Events: []kvevents.Event{{Kind: kvevents.KindStored, Blocks: blocks}}}
	out, err := kvevents.AppendBatch(nil, &b)
	if err != nil {
		s.t.Errorf("encode batch: %v", err)
	}
	return out
}

// hashFlood: the registered worker itself stores unique hashes as fast as
// its publisher takes them (a misbehaving engine).
func (s *soak) hashFlood(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		blocks := make([]kvevents.StoredBlock, 128)
		for j := range blocks {
			blocks[j] = kvevents.StoredBlock{Engine: kvevents.EngineHash(rng.Uint64() | 1<<63), Seq: kvevents.SeqHash(rng.Uint64())}
		}
		if err := s.pub.Emit(kvevents.Event{Kind: kvevents.KindStored, Blocks: blocks}); err == nil {
			s.st.floodBlocks.Add(int64(len(blocks)))
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// randomSessions: valid routes, each with a new session id.
func (s *soak) randomSessions(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		body, _ := json.Marshal(&api.RouteRequest{Model: model, TokenIDs: s.prompt(rng)[:64],
			SessionID: fmt.Sprintf("rnd-%016x", rng.Uint64())})
		code, out, err := s.do(ctx, http.MethodPost, "/v1/route", body)
		if ctx.Err() != nil {
			return
		}
		if err == nil && code == http.StatusOK {
			s.st.badServed.Add(1)
			var resp api.RouteResponse
			if json.Unmarshal(out, &resp) == nil {
				_ = s.client.Free(context.WithoutCancel(ctx), model, &resp)
			}
		}
		s.st.badSent.Add(1)
		sleep(ctx, 20*time.Millisecond)
	}
}

// sample records goroutines, RSS and index entries twice a second.
func (s *soak) sample(ctx context.Context, _ *rand.Rand) {
	for ctx.Err() == nil {
		g, rss, idx := runtime.NumGoroutine(), vmRSS(s.t), s.indexEntries()
		s.pkMu.Lock()
		s.pk.goroutines = max(s.pk.goroutines, g)
		s.pk.rss = max(s.pk.rss, rss)
		s.pk.indexEntries = max(s.pk.indexEntries, idx)
		s.pk.lastIndex = idx
		s.pk.samples++
		s.pkMu.Unlock()
		sleep(ctx, 500*time.Millisecond)
	}
}

// indexEntries is the replica's kvr_index_entries, summed over models.
func (s *soak) indexEntries() int64 {
	mfs, err := s.prom.Registry.Gather()
	if err != nil {
		return -1
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "kvr_index_entries" {
			for _, m := range mf.GetMetric() {
				n += m.GetGauge().GetValue()
			}
		}
	}
	return int64(n)
}

// vmRSS reads the process's resident set from /proc/self/status (0 where
// there is none).
func vmRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Errorf("VmRSS %q: %v", l, err)
			}
			return kb << 10
		}
	}
	return 0
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// report checks the bounds and logs what the run did.
func (s *soak) report(b soakBounds) {
	t := s.t
	ok, shed, failed := s.st.goodOK.Load(), s.st.goodShed.Load(), s.st.goodFailed.Load()
	s.pkMu.Lock()
	pk := s.pk
	s.pkMu.Unlock()
	t.Logf("good routes: %d served, %d shed (529/503), %d failed; bad requests: %d sent, %d refused 4xx, %d random-session routes served; "+
		"events forged: %d, flood blocks: %d", ok, shed, failed, s.st.badSent.Load(), s.st.badRefused.Load(), s.st.badServed.Load(),
		s.st.eventsForged.Load(), s.st.floodBlocks.Load())
	t.Logf("slow clients cut off by the server: %d in the header, %d in the body", s.st.slowDropped[0].Load(), s.st.slowDropped[1].Load())
	t.Logf("peaks over %d samples: %d goroutines (bound %d), RSS %d MiB (bound %d MiB), index %d entries (last %d)",
		pk.samples, pk.goroutines, b.MaxGoroutines, pk.rss>>20, b.MaxRSSBytes>>20, pk.indexEntries, pk.lastIndex)
	s.st.failures.Range(func(k, _ any) bool { t.Errorf("good request failed: %s", k); return true })
	s.st.shedWhy.Range(func(k, _ any) bool { t.Logf("good request shed: %s", k); return true })
	total := ok + shed + failed
	if total == 0 || float64(ok) < b.MinServed*float64(total) {
		t.Errorf("served %d of %d good requests, want at least %.0f %%", ok, total, 100*b.MinServed)
	}
	// ReadHeaderTimeout (10 s) cuts header tricklers off within the run.
	if s.st.slowDropped[0].Load() == 0 {
		t.Error("no slow header client was cut off by the server")
	}
	if b.ExpectSlowBodyCut && s.st.slowDropped[1].Load() == 0 {
		t.Error("no slow body client was cut off by the server")
	}
	if pk.samples == 0 {
		t.Error("no sample taken")
	}
	if pk.goroutines > b.MaxGoroutines {
		t.Errorf("goroutines peaked at %d, bound %d", pk.goroutines, b.MaxGoroutines)
	}
	if pk.rss > b.MaxRSSBytes {
		t.Errorf("RSS peaked at %d MiB, bound %d MiB", pk.rss>>20, b.MaxRSSBytes>>20)
	}
	switch {
	case b.IndexMaxEntries > 0 && pk.indexEntries > b.IndexMaxEntries:
		t.Errorf("index peaked at %d entries, bound %d", pk.indexEntries, b.IndexMaxEntries)
	case b.IndexMaxEntries == 0:
		t.Logf("index size not checked: soakBounds.IndexMaxEntries is unset")
	}
	// The flood reached the index: otherwise the index check proves nothing.
	if s.st.floodBlocks.Load() == 0 || pk.indexEntries <= 0 {
		t.Errorf("the hash flood did not reach the index (flood %d blocks, index peak %d)", s.st.floodBlocks.Load(), pk.indexEntries)
	}
}
