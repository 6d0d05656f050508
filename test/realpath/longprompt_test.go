package realpath

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	natsauth "github.com/kvrouter/kvrouter/deploy/nats"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/router/api"
)

// authLogins are the users of deploy/nats/auth.conf (a second worker user
// added as its README says), each with its inbox prefix, by stack role.
var authLogins = map[string]struct{ user, password, inbox string }{
	"router":    {"router", "router-pw", "_INBOX_router"},
	"gateway":   {"gateway", "gateway-pw", "_INBOX_gateway"},
	"worker:e0": {"worker", "worker-e0-pw", "_INBOX_worker"},
	"worker:e1": {"worker2", "worker-e1-pw", "_INBOX_worker"},
}

// startAuthServer runs nats-server in process from deploy/nats/auth.conf,
// unchanged but for a second worker user, on a free loopback port, with
// the environment the file documents for workers e0 and e1. Its
// max_payload is the server's default, 1 MiB.
func startAuthServer(t *testing.T) *server.Server {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "nats", "auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf, err := natsauth.WithWorkerUser(string(raw), "worker2", "NATS_WORKER2")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_ROUTER_PASSWORD", `"router-pw"`)
	t.Setenv("NATS_GATEWAY_PASSWORD", `"gateway-pw"`)
	t.Setenv("NATS_WORKER_PASSWORD", `"worker-e0-pw"`)
	t.Setenv("NATS_WORKER2_PASSWORD", `"worker-e1-pw"`)
	t.Setenv("NATS_ADMIN_PASSWORD", `"admin-pw"`)
	for prefix, worker := range map[string]string{"NATS_WORKER": "e0", "NATS_WORKER2": "e1"} {
		for k, v := range natsauth.WorkerEnv(prefix, testModel, worker) {
			t.Setenv(k, v)
		}
	}
	s := natstest.StartConfig(t, path)
	return s
}

// authConnect logs in as the stack role's user of auth.conf.
func authConnect(s *server.Server) func(t *testing.T, role string) *nats.Conn {
	return func(t *testing.T, role string) *nats.Conn {
		t.Helper()
		l, ok := authLogins[role]
		if !ok {
			t.Fatalf("no auth.conf user for role %q", role)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nc, err := natsconn.Connect(ctx, natsconn.Config{URLs: s.ClientURL(), User: l.user, Password: l.password, InboxPrefix: l.inbox, Name: role},
			nil, testLogger())
		if err != nil {
			t.Fatalf("connect as %s: %v", l.user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// complete sends a completion of token ids through the gateway at gw and
// returns the status, the reply's routing headers and usage, or the error
// body.
func (st *stack) completeIDs(gw string, prompt []uint32) (status int, worker string, overlap, cached int, errBody string) {
	st.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 4})
	// A 200k-token request takes seconds under the race detector on a
	// loaded machine: more than the stack client's bound.
	hc := &http.Client{Transport: st.http.Transport, Timeout: 2 * time.Minute}
	t0 := time.Now()
	defer func() { st.t.Logf("%d-token completion: %v", len(prompt), time.Since(t0)) }()
	resp, err := hc.Post(gw+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		st.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, "", 0, 0, string(out)
	}
	var r struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		st.t.Fatalf("reply %.200s: %v", out, err)
	}
	overlap, _ = strconv.Atoi(resp.Header.Get(gateway.HeaderOverlapBlocks))
	return resp.StatusCode, resp.Header.Get(gateway.HeaderWorker), overlap, r.Usage.PromptTokensDetails.CachedTokens, ""
}

// A 200k-token prompt through the gateway, over an external nats-server
// configured from deploy/nats/auth.conf (max_payload 1 MiB), every
// component logged in as its own role: its token ids (1.4 MB of JSON) do
// not fit in one route request, so the gateway's route API client sends
// the prompt's block hashes. Sent twice, the second goes to the worker
// holding it and the router's predicted overlap equals the engine's
// cached_tokens in blocks. A prompt past the limit docs/gateway.md states
// is refused with 413 payload_too_large, before any engine sees it.
func TestLongPromptOverAuthNATS(t *testing.T) {
	srv := startAuthServer(t)
	st := startStack(t, stackOpts{engines: 2, replicas: 2, kvBlocks: 16384, maxModelLen: 300_000, eventsOnly: true,
		srv: srv, connect: authConnect(srv)})
	nc, _ := st.conn("gateway")
	client := api.NewClient(nc, "", nil)
	if mp := nc.MaxPayload(); mp != 1<<20 {
		t.Fatalf("the server's max_payload is %d, auth.conf leaves the default 1 MiB", mp)
	}
	gw := st.gatewayURL(gateway.ClientRouter{C: client})

	const n = 200_003 // not a whole number of blocks: vLLM never counts the last token as cached
	prompt := make([]uint32, n)
	for i := range prompt {
		prompt[i] = 100_000 + uint32(i*7919)%900_000 // six digits, as a real vocabulary's ids
	}
	if size := len(api.AppendRouteRequest(nil, &api.RouteRequest{Model: testModel, TokenIDs: prompt})); size <= client.MaxRouteBody() {
		t.Fatalf("the prompt's token ids take %d bytes, within the limit %d: the test would not need block hashes", size, client.MaxRouteBody())
	}
	status, first, overlap, cached, eb := st.completeIDs(gw, prompt)
	if status != http.StatusOK || overlap != 0 || cached != 0 {
		t.Fatalf("first: %d %s overlap %d cached %d %s", status, first, overlap, cached, eb)
	}
	st.indexesCaughtUp()
	status, second, overlap, cached, eb := st.completeIDs(gw, prompt)
	switch {
	case status != http.StatusOK:
		t.Fatalf("second: %d %s", status, eb)
	case second != first:
		t.Fatalf("second went to %s, the prompt is cached on %s", second, first)
	case overlap != cached/testBlock || overlap != n/testBlock:
		t.Fatalf("second: the router predicted %d blocks, the engine cached %d tokens (%d blocks), the prompt has %d blocks",
			overlap, cached, cached/testBlock, n/testBlock)
	}
	t.Logf("%d-token prompt: routed as %d block hashes under max_payload %d, overlap %d blocks = cached %d tokens on %s",
		n, n/testBlock, nc.MaxPayload(), overlap, cached, second)

	// The longest prompt a request may carry (2 Mi tokens): past the
	// stated limit, its block hashes (8 bytes each in the hash trailer,
	// 1 MiB in all) no longer fit under this max_payload either.
	limit := api.MaxPromptTokens(client.MaxRouteBody(), testBlock)
	huge := make([]uint32, api.MaxTokens)
	if len(huge) <= limit || 8*len(huge)/testBlock <= client.MaxRouteBody() {
		t.Fatalf("a %d-token prompt fits under max_payload %d (limit %d): the test needs one that does not", len(huge), nc.MaxPayload(), limit)
	}
	for i := range huge {
		huge[i] = uint32(i % 97)
	}
	before := st.completed()
	status, _, _, _, eb = st.completeIDs(gw, huge)
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if status != http.StatusRequestEntityTooLarge || json.Unmarshal([]byte(eb), &e) != nil || e.Error.Code != api.CodePayloadTooLarge ||
		!strings.Contains(e.Error.Message, "max_payload") {
		t.Fatalf("a %d-token prompt (limit %d): %d %s", len(huge), limit, status, eb)
	}
	if after := st.completed(); !maps.Equal(before, after) {
		t.Fatalf("an engine served the refused prompt: %v then %v", before, after)
	}
	st.waitIdle()
	if err := nc.LastError(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("the gateway's connection: %v", err)
	}
}
