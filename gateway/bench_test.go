package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workers"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// stubEngine answers /tokenize and the generate endpoints at once, so that
// a benchmark measures the gateway and not the engine: a reply is a role
// chunk, one content chunk and [DONE] (streams) or one JSON object. With
// render it answers POST /v1/chat/completions/render too, as vLLM's (the
// same ids); without, that path is 404.
func stubEngine(tb testing.TB, promptTokens int, render bool) *httptest.Server {
	var ids bytes.Buffer
	for i := range promptTokens {
		if i > 0 {
			ids.WriteByte(',')
		}
		fmt.Fprint(&ids, 32+i%90)
	}
	tokBody := []byte(`{"count":` + fmt.Sprint(promptTokens) + `,"max_model_len":8192,"tokens":[` + ids.String() + `],"token_strs":null}`)
	renderBody := []byte(`{"request_id":"chatcmpl-1","token_ids":[` + ids.String() + `],"features":null,` +
		`"sampling_params":{"n":1,"temperature":1.0,"max_tokens":1},"model":"m","stream":true,"stream_options":null,` +
		`"cache_salt":null,"priority":0,"kv_transfer_params":null}`)
	whole := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	events := [][]byte{
		[]byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"),
		[]byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"length"}]}` + "\n\n"),
		[]byte("data: [DONE]\n\n"),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(tokBody)
	})
	if render {
		mux.HandleFunc("POST /v1/chat/completions/render", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(renderBody)
		})
	}
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(whole)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, ev := range events {
			_, _ = w.Write(ev)
			_ = rc.Flush()
		}
	})
	s := labelledServer("engine", mux)
	tb.Cleanup(s.Close)
	return s
}

// labelledServer starts a test server whose goroutines carry the pprof
// label role, so that a CPU profile of a benchmark splits the process's
// time between the engine stub, the gateway and the load generator.
func labelledServer(role string, h http.Handler) *httptest.Server {
	s := httptest.NewUnstartedServer(h)
	pprof.Do(context.Background(), pprof.Labels("role", role), func(context.Context) { s.Start() })
	return s
}

// benchFleet is one replica with one stub engine registered as worker "stub".
func benchFleet(b *testing.B, promptTokens int, render bool) (*fleet, *httptest.Server) {
	f := startFleet(b, fleetOpts{replicas: 1})
	eng := stubEngine(b, promptTokens, render)
	info := workers.Info{ID: "stub", Model: testModel, Endpoint: eng.URL + "/v1", Ranks: []uint32{0}, BlockSize: 16,
		KVBlocks: 1 << 16, MaxBatchedTokens: 8192, MaxSeqs: 1 << 16}
	reg, err := workers.Register(context.Background(), f.js, testRegistry(), info)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = reg.Deregister(context.Background()) })
	f.waitWorkers(1)
	return f, eng
}

// firstToken posts a streaming chat request to base and returns the time
// to the first content event.
func firstToken(b *testing.B, hc *http.Client, base string, body []byte) time.Duration {
	t0 := time.Now()
	resp, err := hc.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var d time.Duration
	for {
		line, err := br.ReadSlice('\n')
		if d == 0 && bytes.Contains(line, []byte(`"content":"hi"`)) {
			d = time.Since(t0)
		}
		if err != nil {
			break
		}
	}
	if d == 0 {
		b.Fatalf("no first token (status %d)", resp.StatusCode)
	}
	return d
}

func reportPercentiles(b *testing.B, ds []time.Duration) {
	p50, p99 := percentiles(ds)
	b.ReportMetric(µs(p50), "p50-µs")
	b.ReportMetric(µs(p99), "p99-µs")
}

// percentiles sorts ds and returns its p50 and p99.
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100]
}

func µs(d time.Duration) float64 { return float64(d) / 1e3 }

// BenchmarkTTFT is time to first token, on loopback, of the same streaming
// request straight to the engine and through the gateway (in process over
// the replica, and over NATS), 2,048-character prompt. Each iteration sends
// one request of each, in turn, so that the three see the same noise; the
// overhead is the gateway's percentile minus the engine's (p50 minus p50,
// p99 minus p99). p50-µs and p99-µs are the gateway's in process. Its
// parts (tokenize, route) are BenchmarkTTFTParts.
func BenchmarkTTFT(b *testing.B) {
	const promptTokens = 2048
	f, eng := benchFleet(b, promptTokens, false)
	body := []byte(`{"model":"m","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x", promptTokens) + `"}]}`)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(hc.CloseIdleConnections)
	bases := []string{eng.URL, f.gateway(nil, nil), f.gateway(f.natsRouter(), nil)}
	for _, base := range bases { // connections and the render probe before the clock
		firstToken(b, hc, base, body)
	}
	ds := make([][]time.Duration, len(bases))
	i := 0
	for b.Loop() {
		for k := range bases {
			j := (i + k) % len(bases)
			ds[j] = append(ds[j], firstToken(b, hc, bases[j], body))
		}
		i++
	}
	direct50, direct99 := percentiles(ds[0])
	in50, in99 := percentiles(ds[1])
	nats50, nats99 := percentiles(ds[2])
	b.ReportMetric(µs(in50), "p50-µs")
	b.ReportMetric(µs(in99), "p99-µs")
	b.ReportMetric(µs(direct50), "direct-p50-µs")
	b.ReportMetric(µs(direct99), "direct-p99-µs")
	b.ReportMetric(µs(in50-direct50), "overhead-p50-µs")
	b.ReportMetric(µs(in99-direct99), "overhead-p99-µs")
	b.ReportMetric(µs(nats50-direct50), "nats-overhead-p50-µs")
	b.ReportMetric(µs(nats99-direct99), "nats-overhead-p99-µs")
}

// BenchmarkTTFTParts times the parts of the gateway's TTFT alone: the
// /tokenize call of BenchmarkTTFT's prompt and the route call (in process
// and over NATS) of its 2,048 tokens.
func BenchmarkTTFTParts(b *testing.B) {
	const promptTokens = 2048
	f, eng := benchFleet(b, promptTokens, false)
	body := []byte(`{"model":"m","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x", promptTokens) + `"}]}`)
	b.Run("tokenize", func(b *testing.B) {
		g, _ := New(Config{Router: ReplicaRouter{R: f.replicas[0]}, Models: []string{testModel}})
		cr, _ := readRequest(kindChat, body)
		ds := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			if _, err := g.tokenize(context.Background(), eng.URL, kindChat, &cr, body); err != nil {
				b.Fatal(err)
			}
			ds = append(ds, time.Since(t0))
		}
		reportPercentiles(b, ds)
	})
	for _, rt := range []struct {
		name string
		r    Router
	}{{"route-inprocess", ReplicaRouter{R: f.replicas[0]}}, {"route-nats", f.natsRouter()}} {
		b.Run(rt.name, func(b *testing.B) {
			toks := make([]uint32, promptTokens)
			for i := range toks {
				toks[i] = uint32(32 + i%90)
			}
			ds := make([]time.Duration, 0, b.N)
			var resp api.RouteResponse
			for b.Loop() {
				t0 := time.Now()
				if err := rt.r.Route(context.Background(), &api.RouteRequest{Model: testModel, TokenIDs: toks}, &resp); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(t0))
				if err := rt.r.Free(context.Background(), testModel, &resp); err != nil {
					b.Fatal(err)
				}
			}
			reportPercentiles(b, ds)
		})
	}
}

// BenchmarkTTFTRender is BenchmarkTTFT against an engine with vLLM's render
// endpoint, which the gateway then asks instead of /tokenize (the client's
// whole body, every field): direct, through the gateway in process, and
// the render and /tokenize calls alone. 2,048-token prompt.
func BenchmarkTTFTRender(b *testing.B) {
	const promptTokens = 2048
	f, eng := benchFleet(b, promptTokens, true)
	body := []byte(`{"model":"m","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x", promptTokens) + `"}]}`)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(hc.CloseIdleConnections)
	timed := func(b *testing.B, call func()) {
		ds := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			call()
			ds = append(ds, time.Since(t0))
		}
		reportPercentiles(b, ds)
	}
	b.Run("direct", func(b *testing.B) { timed(b, func() { firstToken(b, hc, eng.URL, body) }) })
	b.Run("gateway-inprocess", func(b *testing.B) {
		base := f.gateway(nil, nil)
		timed(b, func() { firstToken(b, hc, base, body) })
	})
	g, _ := New(Config{Router: ReplicaRouter{R: f.replicas[0]}, Models: []string{testModel}})
	cr, _ := readRequest(kindChat, body)
	b.Run("render", func(b *testing.B) {
		timed(b, func() {
			if tr, err := g.tokenize(context.Background(), eng.URL, kindChat, &cr, body); err != nil || len(tr.Tokens) != promptTokens {
				b.Fatal(err)
			}
		})
	})
	b.Run("tokenize", func(b *testing.B) {
		timed(b, func() {
			if tr, err := g.tokenizeCall(context.Background(), eng.URL, kindChat, &cr); err != nil || len(tr.Tokens) != promptTokens {
				b.Fatal(err)
			}
		})
	})
}

// BenchmarkThroughput is non-streaming requests per second through one
// gateway (in process over the replica, and over NATS), small prompts,
// engine stub, replica and gateway sharing the machine. cpu-µs/req is the
// process's CPU time per request (load generator, gateway, replica, NATS
// and engine stub together): the figure that holds when other jobs share
// the cores and req/s does not.
func BenchmarkThroughput(b *testing.B) {
	f, _ := benchFleet(b, 32, false)
	body := []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a small prompt of about thirty two"}]}`)
	for _, rt := range []struct {
		name string
		r    Router
	}{{"inprocess", nil}, {"nats", f.natsRouter()}} {
		b.Run(rt.name, func(b *testing.B) {
			base := f.gateway(rt.r, nil)
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			defer hc.CloseIdleConnections()
			b.SetParallelism(8)
			t0, c0 := time.Now(), cpuTime()
			b.RunParallel(func(pb *testing.PB) {
				pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("role", "client")))
				for pb.Next() {
					resp, err := hc.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "req/s")
			b.ReportMetric(µs(cpuTime()-c0)/float64(b.N), "cpu-µs/req")
		})
	}
}

// discardWriter is an http.ResponseWriter and Flusher that keeps nothing.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

// BenchmarkStreamRelay relays a stream of n token events through the
// gateway's relay (exchange.stream; no tokenize, no route) from an engine
// to a client, both over loopback HTTP, the engine writing and flushing
// event after event as fast as it can. Each iteration also sends the same
// stream from the engine straight to the client; cpu-ns/token is the
// process's CPU time of the relayed streams minus that of the direct ones,
// per token event: the relay's own cost, system calls included, on both
// of its connections. allocs/chunk is the relay alone (in memory, to a
// writer that keeps nothing), per event: it must not grow with n (no
// allocation per chunk beyond the chunk itself, which the relay does not
// copy).
func BenchmarkStreamRelay(b *testing.B) {
	g, err := New(Config{Router: fakeRouter{}, Models: []string{testModel}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(g.http.CloseIdleConnections)
	chunk := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n"
	_, span := tracenoop.NewTracerProvider().Tracer("").Start(context.Background(), "")
	rq := &api.RouteRequest{Model: testModel}
	eng := labelledServer("engine", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range n {
			_, _ = io.WriteString(w, chunk)
			_ = rc.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	b.Cleanup(eng.Close)
	gw := labelledServer("gateway", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up, err := g.http.Get(eng.URL + "/?" + r.URL.RawQuery)
		if err != nil {
			b.Error(err)
			return
		}
		defer up.Body.Close()
		x := exchange{g: g, w: w, r: r, rq: rq, span: span, booked: true}
		x.stream(r.Context(), up)
	}))
	b.Cleanup(gw.Close)
	hc := &http.Client{Transport: &http.Transport{}}
	b.Cleanup(hc.CloseIdleConnections)
	buf := make([]byte, 64<<10)
	// get reads one stream from base and returns the process CPU time it took.
	get := func(url string, want int64) time.Duration {
		c0 := cpuTime()
		resp, err := hc.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		if err != nil || n != want {
			b.Fatalf("read %d bytes of %d: %v", n, want, err)
		}
		return cpuTime() - c0
	}
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			stream := []byte(strings.Repeat(chunk, n) + "data: [DONE]\n\n")
			q := "/?n=" + strconv.Itoa(n)
			get(eng.URL+q, int64(len(stream))) // connections before the clock
			get(gw.URL+q, int64(len(stream)))
			var direct, relayed time.Duration
			i := 0
			b.ReportAllocs()
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				if i%2 == 0 {
					direct += get(eng.URL+q, int64(len(stream)))
					relayed += get(gw.URL+q, int64(len(stream)))
				} else {
					relayed += get(gw.URL+q, int64(len(stream)))
					direct += get(eng.URL+q, int64(len(stream)))
				}
				i++
			}
			b.ReportMetric(float64(relayed-direct)/float64(i*n), "cpu-ns/token")
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			w := &discardWriter{h: http.Header{}}
			rd := bytes.NewReader(stream)
			up := &http.Response{StatusCode: 200, Body: io.NopCloser(rd)}
			b.ReportMetric(float64(testing.AllocsPerRun(1, func() {
				rd.Reset(stream)
				x := exchange{g: g, w: w, r: req, rq: rq, span: span, booked: true}
				x.stream(context.Background(), up)
			}))/float64(n), "allocs/chunk")
		})
	}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPromptIDs reads a completion prompt of 11,250 token ids (the
// conversation trace's mean input) as the gateway does, and as
// encoding/json did before (the profile of the gateway-path replay put a
// third of the gateway's CPU there).
func BenchmarkPromptIDs(b *testing.B) {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i := range 11250 {
		if i > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprint(&buf, (i*7919)%151936)
	}
	buf.WriteByte(']')
	raw := buf.Bytes()
	for _, c := range []struct {
		name string
		read func([]byte) ([]uint32, bool)
	}{{"gateway", func(r []byte) ([]uint32, bool) { return promptIDs(r) }}, {"encoding-json", promptIDsJSON}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if ids, ok := c.read(raw); !ok || len(ids) != 11250 {
					b.Fatal(len(ids), ok)
				}
			}
		})
	}
}

// BenchmarkReadRequest reads the routing fields of a streaming completion
// whose prompt is 11,250 token ids (the conversation trace's mean input) and
// of a short chat body, by the hand reader (clientRequest.scan) and by
// encoding/json (what readRequest did before, and does for bodies scan
// hands over).
func BenchmarkReadRequest(b *testing.B) {
	var buf bytes.Buffer
	buf.WriteString(`{"model":"m","stream":true,"max_tokens":2048,"prompt":[`)
	for i := range 11250 {
		if i > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprint(&buf, (i*7919)%151936)
	}
	buf.WriteString(`]}`)
	bodies := []struct {
		name, kind string
		body       []byte
	}{
		{"ids11250", kindCompletion, buf.Bytes()},
		{"chat", kindChat, []byte(`{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}],"stream":true,"max_completion_tokens":256,"user":"u-17"}`)},
	}
	for _, bc := range bodies {
		for _, r := range []struct {
			name string
			read func(kind string, body []byte) error
		}{
			{"scan", func(kind string, body []byte) error { _, e := readRequest(kind, body); return errOrNil(e) }},
			{"encoding-json", func(_ string, body []byte) error { var cr clientRequest; return json.Unmarshal(body, &cr) }},
		} {
			b.Run(bc.name+"/"+r.name, func(b *testing.B) {
				b.SetBytes(int64(len(bc.body)))
				b.ReportAllocs()
				for b.Loop() {
					if err := r.read(bc.kind, bc.body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func errOrNil(e *RequestError) error {
	if e == nil {
		return nil
	}
	return e
}
