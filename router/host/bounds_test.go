package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"
)

// Tests of the HTTP and lifecycle bounds of issue 16: timeouts, the shared
// in-flight cap, the body limit and its memory, booking capacity, fences
// and the forwarding pool.

// httpDoAuth is httpDo with an Authorization header (none when auth is "").
func httpDoAuth(t testing.TB, method, url, auth string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// Connections that send one byte every 2 s, in the headers or in the body,
// are closed by the server within its timeouts.
func TestHTTPSlowClientsClosed(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1, mutate: func(_ int, c *Config) {
		c.HTTPReadHeaderTimeout, c.HTTPReadTimeout = time.Second, 2*time.Second
	}})
	addr := st.replicas[0].HTTPAddr()
	const n = 20
	var closed atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for i := 0; i < n; i++ {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		head := "POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
		if i%2 == 0 {
			head = "POST /v1/route HTTP/1.1\r\nHost: x\r\n" // dribble the headers
		} else if _, err := io.WriteString(conn, head); err != nil { // dribble the body
			t.Fatal(err)
		}
		wg.Add(2)
		go func() { // the slow client: one byte every 2 s
			defer wg.Done()
			tick := time.NewTicker(2 * time.Second)
			defer tick.Stop()
			for {
				if _, err := conn.Write([]byte("x")); err != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
		go func() { // the server closes (after an error reply or not)
			defer wg.Done()
			_, _ = io.Copy(io.Discard, conn)
			closed.Add(1)
		}()
	}
	testutil.Eventually(t, 15*time.Second, func() bool { return closed.Load() == n },
		func() string { return fmt.Sprintf("%d of %d slow connections still open", n-closed.Load(), n) })
}

// The bearer token guards the route, lifecycle and admin endpoints; the
// health endpoints stay open, /metrics too when MetricsOpen.
func TestHTTPToken(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run("metrics open "+strconv.FormatBool(open), func(t *testing.T) {
			st := startStack(t, stackOpts{workers: 1, replicas: 1, mutate: func(_ int, c *Config) {
				c.HTTPToken, c.MetricsOpen = "s3cret", open
			}})
			st.waitWorkers(1)
			base := "http://" + st.replicas[0].HTTPAddr()
			body := api.AppendRouteRequest(nil, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64)})
			metrics := 401
			if open {
				metrics = 200
			}
			for _, c := range []struct {
				method, path, auth string
				body               []byte
				want               int
			}{
				{"POST", "/v1/route", "", body, 401},
				{"POST", "/v1/route", "Bearer wrong", body, 401},
				{"POST", "/v1/route", "Basic s3cret", body, 401},
				{"POST", "/v1/route", "Bearer s3cret", body, 200},
				{"GET", "/v1/workers", "", nil, 401},
				{"GET", "/v1/workers", "Bearer s3cret", nil, 200},
				{"DELETE", "/v1/requests/x", "", nil, 401},
				{"GET", "/v1/sessions/s", "", nil, 401},
				{"GET", "/healthz", "", nil, 200},
				{"GET", "/readyz", "", nil, 200},
				{"GET", "/metrics", "", nil, metrics},
				{"GET", "/metrics", "Bearer s3cret", nil, 200},
			} {
				code, b := httpDoAuth(t, c.method, base+c.path, c.auth, c.body)
				if code != c.want {
					t.Errorf("%s %s auth %q: %d %s, want %d", c.method, c.path, c.auth, code, b, c.want)
				}
				if c.want == 401 {
					if e := api.DecodeError(b); e == nil || e.Code != api.CodeUnauthorized {
						t.Errorf("%s %s: body %s, want the unauthorized envelope", c.method, c.path, b)
					}
				}
			}
		})
	}
}

// newGate registers a policy that holds route requests in the scheduler
// while armed.
func newGate(t *testing.T) (gatePolicy, *scheduler.Registry) {
	t.Helper()
	gate := gatePolicy{armed: new(atomic.Bool), entered: make(chan struct{}, 1), release: make(chan struct{})}
	reg := scheduler.NewRegistry()
	if err := reg.RegisterPolicy("gate", func(*scheduler.Registry, *yaml.Node) (scheduler.Policy, error) { return gate, nil }); err != nil {
		t.Fatal(err)
	}
	return gate, reg
}

// MaxInFlight is one cap for HTTP and NATS together: with it reached by
// one request on each transport, both answer 529 at once.
func TestInFlightCapSharedByHTTPAndNATS(t *testing.T) {
	gate, reg := newGate(t)
	st := startStack(t, stackOpts{workers: 1, replicas: 1, mutate: func(_ int, c *Config) {
		c.Policy, c.PolicyRegistry, c.MaxInFlight = scheduler.PolicyConfig{Name: "gate"}, reg, 2
	}})
	st.waitWorkers(1)
	r := st.replicas[0]
	ctx := ctxT(t)
	base := "http://" + r.HTTPAddr()
	gate.armed.Store(true)
	held := make(chan error, 2)
	go func() {
		_, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64)})
		held <- err
	}()
	go func() {
		code, b := httpDo(t, "POST", base+"/v1/route", api.AppendRouteRequest(nil, &api.RouteRequest{Model: testModel, TokenIDs: tokens(2, 64)}))
		if code != 200 {
			held <- fmt.Errorf("held HTTP route: %d %s", code, b)
			return
		}
		held <- nil
	}()
	<-gate.entered
	testutil.Eventually(t, 10*time.Second, func() bool { return r.inflight.count() == 2 },
		func() string { return "requests in flight: " + strconv.Itoa(r.inflight.count()) })

	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Post(base+"/v1/route", "application/json",
		bytes.NewReader(api.AppendRouteRequest(nil, &api.RouteRequest{Model: testModel, TokenIDs: tokens(3, 64)})))
	if err != nil {
		t.Errorf("HTTP route past the cap: %v (want 529 at once)", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != api.StatusOverloaded {
			t.Errorf("HTTP route past the cap: %d %s, want 529", resp.StatusCode, b)
		}
	}
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = st.client.Route(nctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(4, 64)})
	cancel()
	if !errors.Is(err, api.ErrOverloaded) {
		t.Errorf("NATS route past the cap: %v, want overloaded", err)
	}
	gate.armed.Store(false)
	close(gate.release)
	for i := 0; i < 2; i++ {
		if err := <-held; err != nil {
			t.Error(err)
		}
	}
}

// heapInuse is the heap in use after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// Large route bodies leave no memory behind once answered: the heap after
// a collection returns near where it started (today's pools kept every
// buffer a 16 MiB body grew).
func TestLargeBodiesReleased(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit int64
	}{{"derived limit", 0}, {"16 MiB limit", api.MaxRouteBodySize}} {
		t.Run(c.name, func(t *testing.T) {
			st := startStack(t, stackOpts{workers: 1, replicas: 1, mutate: func(_ int, cfg *Config) { cfg.MaxBodyBytes = c.limit }})
			st.waitWorkers(1)
			base := "http://" + st.replicas[0].HTTPAddr()
			var body bytes.Buffer
			body.WriteString(`{"model":"m","expected_output_tokens":1,"token_ids":[`)
			for body.Len() < 12<<20 {
				body.WriteString("123456,")
			}
			body.WriteString("1]}")
			before := heapInuse()
			const n = 8
			var wg sync.WaitGroup
			codes := make([]int, n)
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					resp, err := http.Post(base+"/v1/route", "application/json", bytes.NewReader(body.Bytes()))
					if err != nil {
						return // the server may close the connection on a refused body
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					codes[i] = resp.StatusCode
				}(i)
			}
			wg.Wait()
			http.DefaultClient.CloseIdleConnections()
			after := heapInuse()
			t.Logf("heap in use before %d MiB, after %d bodies of %d MiB: %d MiB (statuses %v)", before>>20, n, body.Len()>>20, after>>20, codes)
			if after > before+48<<20 {
				t.Fatalf("heap in use grew from %d MiB to %d MiB after %d large bodies", before>>20, after>>20, n)
			}
		})
	}
}

// A request that needs more KV than the largest worker holds is a 400
// naming the limit, before booking: the numbers (2^24 expected
// output tokens, 2^21 input tokens) against a worker of 4096 blocks.
func TestBookingBeyondCapacityRefused(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	ctx := ctxT(t)
	for _, c := range []struct {
		name string
		req  api.RouteRequest
	}{
		{"expected output 2^24", api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64), ExpectedOutputTokens: 1 << 24}},
		{"input 2^21", api.RouteRequest{Model: testModel, InputTokens: 1 << 21}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := st.client.Route(ctx, &c.req)
			var e *api.Error
			if !errors.As(err, &e) || e.Code != api.CodeExceedsCapacity || e.Status != 400 || !strings.Contains(e.Message, "4096 blocks") {
				t.Fatalf("route: %v, want a 400 exceeds_capacity naming the 4096-block limit", err)
			}
		})
	}
	w, _ := st.replicas[0].Workers(testModel)
	if l := w.Workers[0].Load; l != nil && l.ActiveRequests != 0 {
		t.Fatalf("refused requests were booked: %+v", l)
	}
	ok, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64), ExpectedOutputTokens: 4096*16 - 64})
	if err != nil {
		t.Fatalf("a request that fits: %v", err)
	}
	if err := st.client.Free(ctx, testModel, ok); err != nil {
		t.Fatal(err)
	}
}

// Generated request ids are unguessable, and a lifecycle call must present
// the booking's fence: a third party knowing the id (and the replica)
// cannot free, cancel or mark someone else's request.
func TestThirdPartyCannotFree(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 2})
	st.waitWorkers(1)
	ctx := ctxT(t)
	resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64)})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^rep-[01]-[0-9a-f]{24}$`).MatchString(resp.RequestID) {
		t.Errorf("generated request id %q, want <replica>-<96 random bits in hex>", resp.RequestID)
	}
	if resp.Fence == "" {
		t.Fatalf("route reply without a fence: %+v", resp)
	}
	other := st.replicas[0]
	if other.ID() == resp.Replica {
		other = st.replicas[1]
	}
	third := func(op string, lr api.LifecycleRequest) error {
		data, _ := json.Marshal(&lr)
		reply, err := st.nc.Request(api.LifecycleSubject("", op, testModel), data, 5*time.Second)
		if err != nil {
			return err
		}
		if e := api.DecodeError(reply.Data); e != nil {
			return e
		}
		return nil
	}
	for _, op := range []string{api.OpPrefillDone, api.OpCancel, api.OpFree} {
		for _, c := range []struct {
			name string
			lr   api.LifecycleRequest
		}{
			{"no fence", api.LifecycleRequest{RequestID: resp.RequestID, Replica: resp.Replica}},
			{"attempt, no fence", api.LifecycleRequest{RequestID: resp.RequestID, Replica: resp.Replica, Attempt: resp.Attempt}},
			{"wrong fence", api.LifecycleRequest{RequestID: resp.RequestID, Replica: resp.Replica, Fence: strings.Repeat("0", len(resp.Fence))}},
		} {
			if err := third(op, c.lr); err == nil {
				t.Fatalf("%s with %s succeeded", op, c.name)
			}
		}
		code, b := httpDo(t, "DELETE", "http://"+other.HTTPAddr()+"/v1/requests/"+resp.RequestID+"?replica="+resp.Replica, nil)
		if code != 400 && code != 404 {
			t.Fatalf("HTTP free without a fence via the other replica: %d %s", code, b)
		}
	}
	// The owner's call, with the fence, goes through (once).
	if err := st.client.PrefillDone(ctx, testModel, resp); err != nil {
		t.Fatalf("prefill_done with the fence: %v", err)
	}
	code, b := httpDo(t, "DELETE", "http://"+other.HTTPAddr()+"/v1/requests/"+resp.RequestID+"?replica="+resp.Replica+"&fence="+resp.Fence, nil)
	if code != 200 {
		t.Fatalf("free with the fence via the other replica: %d %s", code, b)
	}
	if err := st.client.Free(ctx, testModel, resp); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("second free: %v, want not found", err)
	}
}

// Lifecycle calls forwarded to a replica that never answers run through a
// bounded pool: past it they are refused at once, and the goroutines stay
// bounded.
func TestForwardedLifecycleBounded(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1, mutate: func(_ int, c *Config) { c.ForwardConcurrency = 16 }})
	// "ghost" takes the calls and never answers.
	for _, op := range []string{api.OpPrefillDone, api.OpFree, api.OpCancel} {
		sub, err := st.nc.Subscribe(api.ReplicaSubject("", "ghost", op), func(*nats.Msg) {})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	inbox := nats.NewInbox()
	var replies atomic.Int32
	sub, err := st.nc.Subscribe(inbox, func(*nats.Msg) { replies.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	base := runtime.NumGoroutine()
	const n = 2000
	for i := 0; i < n; i++ {
		data, _ := json.Marshal(&api.LifecycleRequest{RequestID: "r" + strconv.Itoa(i), Replica: "ghost", Fence: "f"})
		if err := st.nc.PublishRequest(api.LifecycleSubject("", api.OpFree, testModel), inbox, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	peak := 0
	testutil.Eventually(t, 5*time.Second, func() bool {
		peak = max(peak, runtime.NumGoroutine())
		return replies.Load() >= n-16
	}, func() string {
		return fmt.Sprintf("%d of %d forwarded calls answered (goroutines %d, at start %d)", replies.Load(), n, peak, base)
	})
	if peak > base+16+64 {
		t.Fatalf("goroutines peaked at %d (at start %d) for %d forwarded calls with a pool of 16", peak, base, n)
	}
}

// The fence of a booking costs the route one allocation (its string) and
// checking one none; a generated request id one (its string).
func TestFenceAndIDAllocations(t *testing.T) {
	fs := newFenceSigner()
	f := scheduler.Fence{RequestID: "rep-0-0123", Attempt: 7}
	f.Worker.Worker, f.Worker.Rank = "gpu-1", 2
	tok := fs.token(f)
	g := f
	g.Attempt++
	if !fs.valid(f, tok) || fs.valid(g, tok) || newFenceSigner().valid(f, tok) {
		t.Fatal("a fence must be valid for its booking only, under its replica's key")
	}
	if raceEnabled {
		t.Skip("allocation counts: the race detector drops pooled hashers")
	}
	if n := testing.AllocsPerRun(100, func() { _ = fs.token(f) }); n > 1 {
		t.Errorf("token: %v allocations, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = fs.valid(f, tok) }); n != 0 {
		t.Errorf("valid: %v allocations, want 0", n)
	}
	r := &Replica{id: "rep-0"}
	s := &routeScratch{}
	if n := testing.AllocsPerRun(100, func() { _ = r.newRequestID(s) }); n > 1 {
		t.Errorf("newRequestID: %v allocations, want 1", n)
	}
}
