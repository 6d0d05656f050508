package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workerref"
)

// Load is what the clients send.
type Load struct {
	Clients int // even ids use HTTP, odd ids NATS; default 8
	Hard    int // Hard sessions; default 60
	Soft    int // Soft sessions; default 30
	// Think is the mean pause between one client's requests (uniform in
	// 0..2*Think); it paces the load, nothing waits on it. Default 10 ms.
	Think time.Duration
	// Deadline is every route's deadline_ms (default 2 s); a client gives
	// up Deadline+GiveUp after sending (default 10 s: long enough to see
	// how late a route is).
	Deadline time.Duration
	GiveUp   time.Duration
	// Reads is the share of requests that read the session instead of
	// routing (default 0.1). Restrict is the share of routes that name two
	// random allowed_workers: it moves Soft sessions (a re-bind whenever
	// the bound worker is left out) and gets Hard ones refused with
	// binding_rejected (default 0.3 for Soft, a sixth of that for Hard).
	Reads, Restrict float64
	// Spread: sessions enter one after another over this time (the first
	// Hard and Soft ones at once), so that first requests, and reads of
	// bindings another replica just created, happen during every fault.
	// Half of the requests go to one of the five newest sessions of their
	// mode. Zero: all sessions from the start.
	Spread time.Duration
}

func (l *Load) defaults() {
	if l.Clients == 0 {
		l.Clients = 8
	}
	if l.Hard == 0 {
		l.Hard = 60
	}
	if l.Soft == 0 {
		l.Soft = 30
	}
	if l.Think == 0 {
		l.Think = 10 * time.Millisecond
	}
	if l.Deadline == 0 {
		l.Deadline = 2 * time.Second
	}
	if l.GiveUp == 0 {
		l.GiveUp = 10 * time.Second
	}
	if l.Reads == 0 {
		l.Reads = 0.1
	}
	if l.Restrict == 0 {
		l.Restrict = 0.3
	}
}

type sessionSpec struct {
	id     string
	mode   string
	tokens []uint32
}

// Clients runs the load until Stop.
type Clients struct {
	f      *Fleet
	rec    *Recorder
	load   Load
	cancel context.CancelFunc
	wg     sync.WaitGroup
	http   *http.Client
	frees  atomic.Int64 // failed free calls (not part of the history)
}

// RunClients starts the clients. Every request they make is added to rec.
func (f *Fleet) RunClients(rec *Recorder, load Load) *Clients {
	load.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	c := &Clients{f: f, rec: rec, load: load, cancel: cancel,
		http: &http.Client{Timeout: load.Deadline + load.GiveUp, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}}
	var sessions [2][]sessionSpec // Hard, Soft
	for i := 0; i < load.Hard; i++ {
		sessions[0] = append(sessions[0], sessionSpec{id: fmt.Sprintf("hard-%03d", i), mode: Hard, tokens: promptOf(i)})
	}
	for i := 0; i < load.Soft; i++ {
		sessions[1] = append(sessions[1], sessionSpec{id: fmt.Sprintf("soft-%03d", i), mode: Soft, tokens: promptOf(10_000 + i)})
	}
	for id := 0; id < load.Clients; id++ {
		c.wg.Add(1)
		go c.run(ctx, id, &sessions)
	}
	return c
}

// Stop ends the clients and waits for their last requests.
func (c *Clients) Stop() {
	c.cancel()
	c.wg.Wait()
	c.http.CloseIdleConnections()
}

// FailedFrees counts booking releases that failed (they are not checked).
func (c *Clients) FailedFrees() int64 { return c.frees.Load() }

// promptOf is a session's prompt: 64 tokens, 4 blocks, its own.
func promptOf(seed int) []uint32 {
	out := make([]uint32, 64)
	for i := range out {
		out[i] = uint32(seed*1_000_003+i*7919) % 100_000
	}
	return out
}

// pick chooses the session of the next request among those that have
// entered (Load.Spread).
func (c *Clients) pick(rng *rand.Rand, sessions *[2][]sessionSpec) *sessionSpec {
	m := 0
	if rng.IntN(c.load.Hard+c.load.Soft) >= c.load.Hard {
		m = 1
	}
	list := sessions[m]
	n := len(list)
	if c.load.Spread > 0 {
		n = min(n, 1+int(float64(n)*float64(c.rec.Now())/float64(c.load.Spread)))
	}
	if rng.IntN(2) == 0 {
		return &list[n-1-rng.IntN(min(n, 5))]
	}
	return &list[rng.IntN(n)]
}

func (c *Clients) run(ctx context.Context, id int, sessions *[2][]sessionSpec) {
	defer c.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(id), 15))
	var (
		drops   atomic.Int64
		natsAPI *api.Client
	)
	via := "http"
	if id%2 == 1 {
		via = "nats"
		nc := c.f.Connect(id%3, func() { drops.Add(1) })
		natsAPI = api.NewClient(nc, "", nil)
	}
	for ctx.Err() == nil {
		s := c.pick(rng, sessions)
		op := Op{Client: id, Session: s.id, Mode: s.mode, Via: via}
		if rng.Float64() < c.load.Reads {
			op.Kind = Read
		}
		req := &api.RouteRequest{Model: c.f.Model(), TokenIDs: s.tokens, SessionID: s.id, SessionMode: s.mode,
			DeadlineMS: int(c.load.Deadline / time.Millisecond)}
		restrict := c.load.Restrict
		if s.mode == Hard {
			restrict /= 6
		}
		if op.Kind == Route && rng.Float64() < restrict {
			perm := rng.Perm(len(c.f.Workers))
			req.AllowedWorkers = []string{c.f.Workers[perm[0]], c.f.Workers[perm[1]]}
			op.Restricted = true
		}
		if op.Kind == Route {
			op.Deadline = c.load.Deadline
		}
		before, sent := drops.Load(), time.Now()
		rctx, cancel := context.WithTimeout(context.Background(), c.load.Deadline+c.load.GiveUp)
		if natsAPI != nil {
			c.viaNATS(rctx, natsAPI, req, &op)
			// Unanswered is excused when the client's connection dropped,
			// or when a replica's did around the time the reply was due
			// (the request may have been delivered to it, and NATS
			// request-reply is at most once).
			// So is one sent while the network was partitioned: its request
			// or its reply may have crossed a cut link.
			window := sent.Add(c.load.Deadline + c.load.GiveUp)
			op.Excused = op.Transport != "" && (drops.Load() != before ||
				c.f.replicaDropBetween(sent.Add(-time.Second), sent.Add(c.load.Deadline+time.Second)) ||
				c.f.partitionBetween(sent, window))
			if h := c.f.lastHealBetween(sent, time.Now()); !h.IsZero() {
				op.Released = c.rec.At(h)
			}
		} else {
			target := rng.IntN(c.f.Replicas())
			c.viaHTTP(rctx, target, req, &op)
		}
		cancel()
		c.rec.Add(op)
		sleep(ctx, time.Duration(rng.Int64N(int64(2*c.load.Think)+1)))
	}
}

// viaNATS sends one request over the NATS API and fills op with the reply.
func (c *Clients) viaNATS(ctx context.Context, cl *api.Client, req *api.RouteRequest, op *Op) {
	op.Invoke = c.rec.Now()
	if op.Kind == Read {
		resp, err := cl.Session(ctx, req.Model, req.SessionID)
		op.Return = c.rec.Now()
		if err != nil {
			failure(op, err)
			return
		}
		op.Worker, op.Bound, op.Version, op.Replica = resp.Worker, resp.Worker, resp.Version, ""
		return
	}
	resp, err := cl.Route(ctx, req)
	op.Return = c.rec.Now()
	if err != nil {
		failure(op, err)
		return
	}
	routed(op, resp)
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := cl.Free(fctx, req.Model, resp); err != nil {
		c.frees.Add(1)
	}
}

// viaHTTP sends one request to replica target's HTTP API.
func (c *Clients) viaHTTP(ctx context.Context, target int, req *api.RouteRequest, op *Op) {
	base, up := c.f.httpTarget(target)
	target %= c.f.Replicas()
	var (
		status int
		body   []byte
		err    error
	)
	op.Invoke = c.rec.Now()
	if op.Kind == Read {
		status, body, err = c.do(ctx, http.MethodGet, base+"/v1/sessions/"+url.PathEscape(req.SessionID)+"?model="+url.QueryEscape(req.Model), nil)
	} else {
		b, _ := json.Marshal(req)
		status, body, err = c.do(ctx, http.MethodPost, base+"/v1/route", b)
	}
	op.Return = c.rec.Now()
	_, upAfter := c.f.httpTarget(target)
	switch {
	case err != nil:
		op.Transport = err.Error()
		// A replica being restarted refuses connections: the client's
		// loss, like a dropped NATS connection.
		op.Excused = !up || !upAfter
		return
	case status != http.StatusOK:
		if e := api.DecodeError(body); e != nil {
			failure(op, e)
			return
		}
		op.Code, op.Status = fmt.Sprintf("http_%d", status), status
		return
	}
	if op.Kind == Read {
		var resp api.SessionResponse
		if err := json.Unmarshal(body, &resp); err != nil {
			op.Code, op.Status = "bad_reply", status
			return
		}
		op.Worker, op.Bound, op.Version = resp.Worker, resp.Worker, resp.Version
		op.Replica = fmt.Sprintf("replica %d", target)
		return
	}
	var resp api.RouteResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		op.Code, op.Status = "bad_reply", status
		return
	}
	routed(op, &resp)
	_, _, _ = c.do(context.Background(), http.MethodDelete, base+"/v1/requests/"+url.PathEscape(resp.RequestID), nil)
}

func (c *Clients) do(ctx context.Context, method, u string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// routed fills op from a route reply.
func routed(op *Op, resp *api.RouteResponse) {
	op.Worker, op.Replica = resp.Worker, resp.Replica
	if b := resp.Binding; b != nil {
		op.Outcome, op.Bound, op.Version = b.Outcome, b.Worker, b.Version
	}
}

// rejectedFor finds the bound worker in binding_rejected's message
// ("... is bound (hard) to live worker w1, which cannot ...").
var rejectedFor = regexp.MustCompile(`live worker (\S+?),`)

// failure fills op from an error: an API error's code, else the transport
// failure.
func failure(op *Op, err error) {
	var ae *api.Error
	if !errors.As(err, &ae) {
		op.Transport = err.Error()
		return
	}
	op.Code, op.Status, op.Message = ae.Code, ae.Status, ae.Message
	if ae.Code == api.CodeBindingRejected {
		if m := rejectedFor.FindStringSubmatch(ae.Message); m != nil {
			if t, err := workerref.Parse(m[1]); err == nil {
				op.RejectedFor = t.Worker
			}
		}
	}
}
