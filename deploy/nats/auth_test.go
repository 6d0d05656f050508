package natsauth_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bindings"
	natsauth "github.com/kvrouter/kvrouter/deploy/nats"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/host"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoredGoroutines()...)
}

const (
	model   = "m"
	workerA = "gpu-0" // user worker: a bridge-like worker (Register, Publisher, PublishLoad)
	workerB = "sim-0" // user worker2: a simulated worker (sim.Fleet), from a copy of the worker block
)

// Quoted as auth.conf says; the gateway's is digits only, which works
// only quoted. gateway-gw-a and gateway-gw-b are two gateway instances
// with users of their own (natsauth.WithGatewayUser).
var passwords = map[string]string{
	"router": `"router-pw"`, "gateway": `"20261201"`, "worker": "worker-a-pw", "worker2": "worker-b-pw", "admin": `"admin-pw"`,
	"gateway-gw-a": `"gw-a-pw"`, "gateway-gw-b": `"gw-b-pw"`,
}

// gatewayInstances are the gateways with users of their own.
var gatewayInstances = []string{"gw-a", "gw-b"}

// withSecondWorker copies auth.conf's worker block and user for a second
// worker (user worker2, variables NATS_WORKER2_*), as deploy/nats/README.md
// tells operators to do, and adds a user per gateway instance as
// deploy/nats/gatewayusers does.
func withSecondWorker(t *testing.T, conf string) string {
	t.Helper()
	out, err := natsauth.WithWorkerUser(conf, "worker2", "NATS_WORKER2")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gatewayInstances {
		var u natsauth.GatewayUser
		if out, u, err = natsauth.WithGatewayUser(out, g); err != nil {
			t.Fatal(err)
		}
		t.Setenv(u.PasswordVar, passwords[u.User])
	}
	return out
}

// startServer runs auth.conf (plus a second worker) on a random loopback
// port with the environment it documents.
func startServer(t *testing.T) *server.Server {
	t.Helper()
	return natstest.StartConfig(t, prepareConf(t))
}

// prepareConf writes auth.conf with a second worker block and sets the
// environment it documents; it returns the file's path.
func prepareConf(t *testing.T) string {
	t.Helper()
	conf, err := os.ReadFile("auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(path, []byte(withSecondWorker(t, string(conf))), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_ROUTER_PASSWORD", passwords["router"])
	t.Setenv("NATS_GATEWAY_PASSWORD", passwords["gateway"])
	t.Setenv("NATS_WORKER_PASSWORD", passwords["worker"])
	t.Setenv("NATS_WORKER2_PASSWORD", passwords["worker2"])
	t.Setenv("NATS_ADMIN_PASSWORD", passwords["admin"])
	for k, v := range natsauth.WorkerEnv("NATS_WORKER", model, workerA) {
		t.Setenv(k, v)
	}
	for k, v := range natsauth.WorkerEnv("NATS_WORKER2", model, workerB) {
		t.Setenv(k, v)
	}
	return path
}

// role is one connection as one user. Its async errors (natsconn logs
// them) are kept, so a refusal, or a permission a component lacks, shows.
type role struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream
	mu   sync.Mutex
	logs bytes.Buffer
}

func (r *role) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logs.Write(p)
}

// violations are the permission violations the server sent this connection.
func (r *role) violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range strings.Split(r.logs.String(), "\n") {
		if strings.Contains(strings.ToLower(l), "permissions violation") {
			out = append(out, l)
		}
	}
	return out
}

// refused reports whether the server refused subject to this connection.
func (r *role) refused(subject string) bool {
	for _, v := range r.violations() {
		if strings.Contains(v, `\"`+subject+`\"`) || strings.Contains(v, `"`+subject+`"`) {
			return true
		}
	}
	return false
}

// connect logs in as user through natsconn with the role's inbox prefix.
func connect(t *testing.T, s *server.Server, user, inbox string) *role {
	t.Helper()
	r := &role{user: user}
	pw := strings.Trim(passwords[user], `"`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := natsconn.Connect(ctx, natsconn.Config{URLs: s.ClientURL(), User: user, Password: pw, InboxPrefix: inbox, Name: user},
		nil, slog.New(slog.NewTextHandler(r, nil)))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	r.nc = nc
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return r
}

func registry() workers.RegistryConfig {
	return workers.RegistryConfig{TTL: 2 * time.Second, Heartbeat: 500 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
}

func tokens(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i*7919+13) % 50_000
	}
	return out
}

// fleet is one server with auth.conf and every role doing its job with
// the real components: a router replica, worker A registered with its
// events and load, worker B a simulated worker, and a gateway's client.
type fleet struct {
	srv                               *server.Server
	router, gateway, workerA, workerB *role
	replica                           *host.Replica
	client                            *api.Client
	regA                              *workers.Registration
	pubA                              *kvevents.Publisher
	simB                              *sim.Fleet
	prompt                            []uint32
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := &fleet{
		srv:     s,
		router:  connect(t, s, "router", "_INBOX_router"),
		gateway: connect(t, s, "gateway", "_INBOX_gateway"),
		workerA: connect(t, s, "worker", "_INBOX_worker"),
		workerB: connect(t, s, "worker2", "_INBOX_worker"),
		prompt:  tokens(64),
	}
	rep, err := host.New(f.router.nc, host.Config{
		ReplicaID: "rep-0", Models: []string{model}, Registry: registry(),
		Bindings:         bindings.Config{IdleTTL: time.Minute, MarkerTTL: time.Second},
		SnapshotInterval: 300 * time.Millisecond, LoadSnapshot: true,
		Logger: slog.New(slog.NewTextHandler(f.router, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Start(ctx); err != nil {
		t.Fatalf("router replica as user router: %v", err)
	}
	f.replica = rep
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rep.Close(cctx)
	})

	// Worker A: what a bridge does, with the worker side's read-only setup.
	if _, err := f.workerA.js.Stream(ctx, kvevents.DefaultStream); err != nil {
		t.Fatalf("worker looks up the event stream: %v", err)
	}
	f.regA, err = workers.Register(ctx, f.workerA.js, registry(), workers.Info{ID: workerA, Model: model,
		Endpoint: "http://127.0.0.1:1/v1", Ranks: []uint32{0}, BlockSize: 16, KVBlocks: 1024, MaxBatchedTokens: 8192, MaxSeqs: 64})
	if err != nil {
		t.Fatalf("worker registers itself: %v", err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = f.regA.Deregister(cctx)
	})
	f.pubA, err = kvevents.NewPublisher(f.workerA.js, kvevents.PublisherConfig{Model: model, Worker: workerA, MaxDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = f.pubA.Close(cctx)
	})
	seqs := kvevents.SeqHashes(nil, f.prompt, 16, kvevents.SeedFor("", ""))
	blocks := make([]kvevents.StoredBlock, len(seqs))
	for i, h := range seqs {
		blocks[i] = kvevents.StoredBlock{Engine: kvevents.EngineHash(1000 + i), Seq: h}
	}
	if err := f.pubA.Emit(kvevents.Event{Kind: kvevents.KindStored, Blocks: blocks}); err != nil {
		t.Fatal(err)
	}
	if err := f.pubA.Flush(ctx); err != nil {
		t.Fatalf("worker publishes its events: %v", err)
	}

	// Worker B: a simulated worker, registering and serving its generate subject.
	f.simB, err = sim.NewFleet(sim.FleetConfig{Count: 1, IDPrefix: "sim",
		Engine:     sim.Config{Model: model, KVBlocks: 1024},
		NewEmitter: sim.PublisherFactory(f.workerB.js, kvevents.PublisherConfig{Model: model, MaxDelay: time.Millisecond}),
		Registry:   registry(), LoadInterval: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.simB.Start(ctx, f.workerB.nc, f.workerB.js); err != nil {
		t.Fatalf("simulated worker as user worker2: %v", err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.simB.Stop(cctx)
	})
	f.client = api.NewClient(f.gateway.nc, "", nil)
	return f
}

func (f *fleet) all() []*role { return []*role{f.router, f.gateway, f.workerA, f.workerB} }

func TestAuthConf(t *testing.T) {
	f := startFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("every role does its job", func(t *testing.T) { f.rolesDoTheirJobs(ctx, t) })
	t.Run("forbidden acts are refused", func(t *testing.T) { f.forbiddenActs(ctx, t) })
	t.Run("state survived the attempts", func(t *testing.T) { f.stateIntact(ctx, t) })
}

func (f *fleet) rolesDoTheirJobs(ctx context.Context, t *testing.T) {
	// Worker A's load report, on its own subject.
	load := workers.LoadReport{Model: model, Worker: workerA, ActiveRequests: 1, KVUsedBlocks: 4, KVTotalBlocks: 1024, At: time.Now()}
	if err := workers.PublishLoad(f.workerA.nc, "", load); err != nil {
		t.Fatal(err)
	}
	var ws *api.WorkersResponse
	testutil.Eventually(t, 15*time.Second, func() bool {
		var err error
		if ws, err = f.client.Workers(ctx, model); err != nil || len(ws.Workers) != 2 {
			return false
		}
		for _, w := range ws.Workers {
			if w.Worker == workerA && (w.IndexedBlocks == 0 || w.Reported == nil) {
				_ = workers.PublishLoad(f.workerA.nc, "", load)
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("the gateway does not see both workers, worker A's blocks and its load report: %+v", ws)
	})
	// The gateway routes (with a session: the router writes a binding),
	// then reports prefill done and free on the replica's own subjects.
	// (allowed_workers: worker A's load report may make the policy prefer
	// B; the point is that A's events reached the router's index.)
	resp, err := f.client.Route(ctx, &api.RouteRequest{Model: model, TokenIDs: f.prompt, SessionID: "chat-1",
		AllowedWorkers: []string{workerA}})
	if err != nil {
		t.Fatalf("gateway routes: %v", err)
	}
	if resp.Worker != workerA || resp.OverlapBlocks == 0 || resp.Binding == nil {
		t.Fatalf("route %+v: want worker A with overlap and a binding", resp)
	}
	if err := f.client.PrefillDone(ctx, model, resp); err != nil {
		t.Fatalf("gateway prefill_done: %v", err)
	}
	if err := f.client.Free(ctx, model, resp); err != nil {
		t.Fatalf("gateway free: %v", err)
	}
	// The router writes index snapshots (SnapshotInterval).
	testutil.Eventually(t, 15*time.Second, func() bool {
		obs, err := f.router.js.ObjectStore(ctx, host.DefaultSnapshotBucket)
		if err != nil {
			return false
		}
		l, err := obs.List(ctx)
		return err == nil && len(l) > 0
	}, func() string { return "the router wrote no index snapshot" })
	for _, r := range f.all() {
		if v := r.violations(); len(v) > 0 {
			t.Errorf("user %s hit permission violations doing its job:\n%s", r.user, strings.Join(v, "\n"))
		}
	}
}

// act is one forbidden act; subject is what the server must refuse.
type act struct {
	name    string
	who     func(*fleet) *role
	subject string
	do      func(ctx context.Context, r *role, subject string) error
}

func publish(body string, hdr ...string) func(context.Context, *role, string) error {
	return func(_ context.Context, r *role, subject string) error {
		m := nats.NewMsg(subject)
		m.Data = []byte(body)
		for i := 0; i+1 < len(hdr); i += 2 {
			m.Header.Set(hdr[i], hdr[i+1])
		}
		m.Reply = r.nc.NewRespInbox()
		return r.nc.PublishMsg(m)
	}
}

func subscribe(_ context.Context, r *role, subject string) error {
	_, err := r.nc.SubscribeSync(subject)
	return err
}

func gw(f *fleet) *role      { return f.gateway }
func wA(f *fleet) *role      { return f.workerA }
func routerR(f *fleet) *role { return f.router }

func (f *fleet) forbiddenActs(ctx context.Context, t *testing.T) {
	keyB := "$KV.kvr-workers." + workers.KeyFor(workerB)
	regValue := func(id string) string {
		b, _ := workers.EncodeInfo(workers.Info{ID: id, Model: model, Endpoint: "http://evil:1", Ranks: []uint32{0},
			BlockSize: 16, KVBlocks: 1 << 20, MaxBatchedTokens: 8192, MaxSeqs: 64, Epoch: 7, State: workers.StateReady})
		return string(b)
	}
	bkey, err := bindings.Key(model, "chat-1")
	if err != nil {
		t.Fatal(err)
	}
	binding := "$KV.kvr-bindings." + bkey
	acts := []act{
		{"gateway registers a fake worker", gw, "$KV.kvr-workers.fake", publish(regValue("fake"), "Nats-TTL", "1h")},
		{"gateway overwrites worker B's registration", gw, keyB, publish(regValue(workerB))},
		{"worker A registers a fake worker", wA, "$KV.kvr-workers.fake", publish(regValue("fake"), "Nats-TTL", "1h")},
		{"worker A overwrites worker B's registration", wA, keyB, publish(regValue(workerB))},
		{"worker A deletes worker B's registration", wA, keyB, publish("", "KV-Operation", "PURGE", "Nats-Rollup", "sub")},
		{"worker A purges the registry", wA, "$JS.API.STREAM.PURGE.KV_kvr-workers", publish(`{}`)},
		{"router writes a registration", routerR, "$KV.kvr-workers.fake", publish(regValue("fake"))},
		{"gateway writes a binding", gw, binding, publish(`{"model":"m","session":"chat-1","worker":"fake"}`)},
		{"gateway deletes a binding", gw, binding, publish("", "KV-Operation", "PURGE", "Nats-Rollup", "sub")},
		{"worker A writes a binding", wA, binding, publish(`{"model":"m","session":"chat-1","worker":"gpu-0"}`)},
		{"worker A deletes a binding through the API", wA, "$JS.API.STREAM.MSG.DELETE.KV_kvr-bindings", publish(`{"seq":1}`)},
		{"gateway purges the bindings", gw, "$JS.API.STREAM.PURGE.KV_kvr-bindings", publish(`{}`)},
		{"worker A forges worker B's events", wA, kvevents.EventSubject("", model, workerB), publish("garbage")},
		{"gateway forges worker A's events", gw, kvevents.EventSubject("", model, workerA), publish("garbage")},
		{"router forges worker A's events", routerR, kvevents.EventSubject("", model, workerA), publish("garbage")},
		{"worker A purges the event stream", wA, "$JS.API.STREAM.PURGE.KVR_EVENTS", publish(`{}`)},
		{"worker A updates the event stream", wA, "$JS.API.STREAM.UPDATE.KVR_EVENTS", publish(`{"name":"KVR_EVENTS","max_msgs":1}`)},
		{"gateway deletes the event stream", gw, "$JS.API.STREAM.DELETE.KVR_EVENTS", publish(`{}`)},
		{"worker A writes an index snapshot chunk", wA, "$O.kvr-index-snapshots.C.forged", publish("garbage")},
		{"worker A writes an index snapshot", wA, "$O.kvr-index-snapshots.M." + "aW5kZXgubS45OTk", publish(`{"name":"index.m.99999999999999999999"}`)},
		{"gateway writes an index snapshot", gw, "$O.kvr-index-snapshots.M.aW5kZXgubS45OTk", publish(`{}`)},
		{"worker A forges worker B's load", wA, workers.LoadSubject("", model, workerB), publish(`{"model":"m","worker":"sim-0","rank":0,"active_requests":999,"at":"2099-01-01T00:00:00Z"}`)},
		{"gateway forges worker A's load", gw, workers.LoadSubject("", model, workerA), publish(`{}`)},
		{"router forges worker A's load", routerR, workers.LoadSubject("", model, workerA), publish(`{}`)},
		{"gateway forges bookings", gw, api.BookingsSubject("", model), publish(`{"v":1,"replica":"evil","events":[]}`)},
		{"worker A forges bookings", wA, api.BookingsSubject("", model), publish(`{"v":1,"replica":"evil","events":[]}`)},
		{"gateway forges decisions", gw, api.DecisionsSubject("", model), publish("KVRD")},
		{"worker A forges decisions", wA, api.DecisionsSubject("", model), publish("KVRD")},
		{"gateway ends a session (admin)", gw, api.SessionEndSubject("", model), publish(`{"v":1,"session_id":"chat-1"}`)},
		{"gateway reads a session (admin)", gw, api.SessionGetSubject("", model), publish(`{"v":1,"session_id":"chat-1"}`)},
		{"worker A routes", wA, api.RouteSubject("", model), publish(`{"model":"m"}`)},
		{"worker A frees a booking", wA, api.LifecycleSubject("", "free", model), publish(`{"request_id":"x"}`)},
		{"gateway answers route requests", gw, api.RouteSubject("", model), subscribe},
		{"gateway reads the router's replies", gw, "_INBOX_router.>", subscribe},
		{"gateway reads the default inboxes", gw, "_INBOX.>", subscribe},
		{"worker A reads the gateway's replies", wA, "_INBOX_gateway.>", subscribe},
		{"worker A takes worker B's generate requests", wA, sim.GenerateSubject("kvr", model, workerB), subscribe},
		{"worker A reads the bookings", wA, api.BookingsSubject("", model), subscribe},
		{"gateway reads the event stream", gw, "$JS.API.CONSUMER.CREATE.KVR_EVENTS", publish(`{}`)},
		{"gateway frees as an operator", gw, api.AdminSubject("", api.OpFree, model), publish(`{"v":1,"request_id":"x"}`)},
		{"gateway cancels as an operator on a replica", gw, api.AdminReplicaSubject("", "rep-0", api.OpCancel), publish(`{"v":1,"request_id":"x"}`)},
		{"worker A frees as an operator", wA, api.AdminSubject("", api.OpFree, model), publish(`{"v":1,"request_id":"x"}`)},
	}
	for _, a := range acts {
		t.Run(a.name, func(t *testing.T) {
			r := a.who(f)
			if err := a.do(ctx, r, a.subject); err != nil {
				t.Fatal(err)
			}
			if err := r.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 5*time.Second, func() bool { return r.refused(a.subject) },
				func() string {
					return fmt.Sprintf("user %s: %s was not refused: %v", r.user, a.subject, r.violations())
				})
		})
	}

	// The same through the real components: registering under another
	// worker's id, or a made-up one, fails; so does the gateway registering.
	for _, c := range []struct {
		name string
		who  *role
		id   string
	}{{"worker A registers as worker B", f.workerA, workerB}, {"worker A registers a fake worker", f.workerA, "fake"},
		{"gateway registers a worker", f.gateway, "fake"}} {
		t.Run(c.name+" (workers.Register)", func(t *testing.T) {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			cfg := registry()
			cfg.TakeOver = true
			reg, err := workers.Register(rctx, c.who.js, cfg, workers.Info{ID: c.id, Model: model, Endpoint: "http://evil:1",
				Ranks: []uint32{0}, BlockSize: 16, KVBlocks: 1024, MaxBatchedTokens: 8192, MaxSeqs: 64})
			if err == nil {
				reg.Stop()
				t.Fatalf("user %s registered worker %q", c.who.user, c.id)
			}
		})
	}
	t.Run("gateway ends a session (api.Client)", func(t *testing.T) {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := f.client.EndSession(rctx, model, "chat-1"); err == nil {
			t.Fatal("the gateway ended a session")
		}
	})
}

// stateIntact: after every attempt the router still sees the two real
// workers as they registered, and the session binding is the router's.
func (f *fleet) stateIntact(ctx context.Context, t *testing.T) {
	ws, err := f.replica.Workers(model)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws.Workers) != 2 {
		t.Fatalf("replica sees %d workers, want 2: %+v", len(ws.Workers), ws.Workers)
	}
	for _, w := range ws.Workers {
		if strings.Contains(w.Endpoint, "evil") {
			t.Errorf("worker %s has a forged endpoint %s", w.Worker, w.Endpoint)
		}
	}
	// What NATS cannot check, the replica does: worker A may publish on its
	// own events subject, but a batch there that names worker B is skipped.
	forged, err := kvevents.AppendBatch(nil, &kvevents.Batch{Model: model, Worker: workerB, Epoch: 99, FirstEventID: 1,
		Events: []kvevents.Event{{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 1, Seq: 2}, {Engine: 3, Seq: 4}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.workerA.js.Publish(ctx, kvevents.EventSubject("", model, workerA), forged); err != nil {
		t.Fatalf("worker A publishes on its own subject: %v", err)
	}
	before := indexed(ws, workerA)
	if err := f.pubA.Emit(kvevents.Event{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 77, Seq: 78}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.pubA.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		ws, err = f.replica.Workers(model)
		return err == nil && indexed(ws, workerA) > before
	}, func() string { return "worker A's batch after the forged one never reached the index" })
	if n := indexed(ws, workerB); n != 0 {
		t.Errorf("worker B has %d indexed blocks from a batch worker A published", n)
	}
	sess, err := f.replica.Session(ctx, model, "chat-1")
	if err != nil || sess.Worker != workerA {
		t.Fatalf("session chat-1: %+v, %v; want bound to %s", sess, err, workerA)
	}
	if err := f.regA.Err(); err != nil {
		t.Fatalf("worker A lost its registration: %v", err)
	}
}

// The embedded server of `kvrouter serve --embedded-auth-config auth.conf`:
// it takes the file's users, the replica connects in-process as router,
// and an anonymous client from outside is refused.
func TestEmbeddedServerWithAuthConf(t *testing.T) {
	path := prepareConf(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := natsconn.Open(ctx, natsconn.Config{Embedded: true, DataDir: t.TempDir(), EmbeddedListen: "127.0.0.1:0",
		EmbeddedAuthConfig: path, User: "router", Password: strings.Trim(passwords["router"], `"`), InboxPrefix: "_INBOX_router"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rep, err := host.New(conn.Conn, host.Config{Models: []string{model}, Registry: registry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Start(ctx); err != nil {
		t.Fatalf("replica on the embedded server as router: %v", err)
	}
	defer func() { _ = rep.Close(context.Background()) }()
	if nc, err := nats.Connect(conn.Embedded.URL(), nats.Timeout(5*time.Second)); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("anonymous client on the embedded server: %v, want an authorization error", err)
	}
	gwc := connect(t, conn.Embedded.Server, "gateway", "_INBOX_gateway")
	if _, err := api.NewClient(gwc.nc, "", nil).Workers(ctx, model); err != nil {
		t.Fatalf("the gateway lists workers through the embedded server: %v", err)
	}
}

func indexed(ws *api.WorkersResponse, worker string) int {
	n := 0
	for _, w := range ws.Workers {
		if w.Worker == worker {
			n += w.IndexedBlocks
		}
	}
	return n
}
