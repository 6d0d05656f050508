package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
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
	s := httptest.NewServer(mux)
	tb.Cleanup(s.Close)
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
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkTTFT is time to first token, on loopback, of the same streaming
// request straight to the engine and through the gateway (in process over
// the replica, and over NATS); the overhead is the difference of the two.
// Tokenize and route are measured alone as well. 2,048-character prompt.
func BenchmarkTTFT(b *testing.B) {
	const promptTokens = 2048
	f, eng := benchFleet(b, promptTokens, false)
	body := []byte(`{"model":"m","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x", promptTokens) + `"}]}`)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(hc.CloseIdleConnections)
	run := func(b *testing.B, base string) {
		ds := make([]time.Duration, 0, b.N)
		for b.Loop() {
			ds = append(ds, firstToken(b, hc, base, body))
		}
		reportPercentiles(b, ds)
	}
	b.Run("direct", func(b *testing.B) { run(b, eng.URL) })
	b.Run("gateway-inprocess", func(b *testing.B) { run(b, f.gateway(nil, nil)) })
	b.Run("gateway-nats", func(b *testing.B) { run(b, f.gateway(f.natsRouter(), nil)) })
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
// engine stub, replica and gateway sharing the machine.
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
			t0 := time.Now()
			b.RunParallel(func(pb *testing.PB) {
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
		})
	}
}

// discardWriter is an http.ResponseWriter and Flusher that keeps nothing.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

// BenchmarkStreamRelay relays a stream of n token events: allocs/op must
// not grow with n (no allocation per chunk beyond the chunk itself, which
// the relay does not copy).
func BenchmarkStreamRelay(b *testing.B) {
	g, err := New(Config{Router: fakeRouter{}, Models: []string{testModel}})
	if err != nil {
		b.Fatal(err)
	}
	chunk := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n"
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			stream := []byte(strings.Repeat(chunk, n) + "data: [DONE]\n\n")
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			w := &discardWriter{h: http.Header{}}
			rd := bytes.NewReader(stream)
			up := &http.Response{StatusCode: 200, Body: io.NopCloser(rd)}
			_, span := tracenoop.NewTracerProvider().Tracer("").Start(context.Background(), "")
			rq := &api.RouteRequest{Model: testModel}
			b.ReportAllocs()
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				rd.Reset(stream)
				x := exchange{g: g, w: w, r: req, rq: rq, span: span, booked: true}
				x.stream(context.Background(), up)
			}
			b.ReportMetric(float64(testing.AllocsPerRun(1, func() {
				rd.Reset(stream)
				x := exchange{g: g, w: w, r: req, rq: rq, span: span, booked: true}
				x.stream(context.Background(), up)
			}))/float64(n), "allocs/chunk")
		})
	}
}
