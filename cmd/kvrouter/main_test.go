package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/host"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoredGoroutines()...)
}

// syncBuf is a goroutine-safe output buffer.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Every subcommand's --help explains every flag, with its variable and
// default, and the flags the issue names are there.
func TestHelpListsEveryFlag(t *testing.T) {
	want := map[string][]string{
		"serve": {"nats-url", "nats-creds", "nats-nkey", "nats-user", "nats-password", "nats-tls-ca", "embedded-nats", "data-dir",
			"models", "http-addr", "queue-group", "policy", "policy-file", "session-mode", "snapshot-interval", "log-level", "trace-file", "otlp-endpoint", "otlp-protocol", "approximate", "approx-ttl"},
		"worker": {"sim", "count", "model", "kv-blocks", "block-size", "speedup", "nats-url", "embedded-nats"},
		"demo":   {"trace", "workers", "replicas", "speedup", "policies", "session-mode", "otlp-endpoint"},
	}
	for cmd, names := range want {
		t.Run(cmd, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(context.Background(), []string{cmd, "--help"}, &out, &errOut); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			lines := strings.Split(out.String(), "\n")
			listed := map[string]bool{}
			for i, line := range lines {
				f := strings.Fields(line)
				if len(f) < 2 || !strings.HasPrefix(line, "  --") {
					continue
				}
				name := f[0][2:]
				if f[len(f)-1] != envName(name) {
					t.Errorf("--%s: no variable on its line: %q", name, line)
				}
				// the explanation and the default follow
				if i+3 >= len(lines) || strings.TrimSpace(lines[i+1]) == "" || !strings.Contains(lines[i+2]+lines[i+3], "(default ") {
					t.Errorf("--%s: no explanation or default", name)
				}
				listed[name] = true
			}
			for _, n := range names {
				if !listed[n] {
					t.Errorf("help of %s lacks --%s", cmd, n)
				}
			}
		})
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "serve") {
		t.Fatalf("kvrouter help: %d %q", code, out.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"nope"},
		{},
		{"serve", "--no-such-flag"},
		{"serve", "--session-mode", "sticky"},
		{"serve", "--openai-pd", "nixl"},
		{"serve", "--log-level", "loud"},
		{"worker"}, // --sim is required
		{"worker", "--sim", "--count", "0"},
		{"demo", "--session-mode", "x"},
		{"demo", "stray-argument"},
		{"demo", "--path", "grpc"},
		{"demo", "--path", "real", "--policies", "random"},
		{"demo", "--path", "real", "--turns", "0"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errOut.String())
		}
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	c := newFlags("t", "about")
	c.SetOutput(io.Discard)
	url := c.str("nats-url", "default", "u")
	n := c.integer("count", 1, "n")
	t.Setenv("KVR_NATS_URL", "nats://from-env:4222")
	t.Setenv("KVR_COUNT", "7")
	if err := c.parse([]string{"--count", "3"}); err != nil {
		t.Fatal(err)
	}
	if *url != "nats://from-env:4222" || *n != 3 {
		t.Fatalf("url %q count %d: want the variable for nats-url and the flag for count", *url, *n)
	}
	c2 := newFlags("t", "about")
	c2.SetOutput(io.Discard)
	c2.integer("count", 1, "n")
	t.Setenv("KVR_COUNT", "seven")
	if err := c2.parse(nil); err == nil || !strings.Contains(err.Error(), "KVR_COUNT") {
		t.Fatalf("bad variable: %v", err)
	}
}

func freePort(t *testing.T) int { return testutil.FreePorts(t, 1) }

// served is a serve command run in process by startServe: its ports[0]
// is the embedded NATS server's, ports[1] the HTTP API's, then the
// caller's.
type served struct {
	*command
	base string // the HTTP API: http://127.0.0.1:<ports[1]>
}

// shutdown stops serve and fails the test unless it exited 0.
func (s *served) shutdown(t *testing.T) {
	t.Helper()
	s.stop()
	if code := <-s.done; code != 0 {
		t.Fatalf("serve exit %d: %s", code, s.errb)
	}
}

// startServe runs serve with the arguments args gives for n ports (n >= 2:
// the embedded NATS server's and the HTTP API's, then any the caller
// needs; runOnPorts, which retries a port taken meanwhile) and waits until
// its /readyz answers 200 and it has printed its ready banner, which comes
// once every listener is bound (/readyz answers before the --openai-addr
// and --epp-addr listeners are).
func startServe(t *testing.T, n int, args func(ports []int) []string) *served {
	t.Helper()
	c := runOnPorts(t, nil, n, args, func(c *command) bool {
		resp, err := probeClient.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", c.ports[1]))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(c.out.String(), " ready: ")
	})
	return &served{command: c, base: fmt.Sprintf("http://127.0.0.1:%d", c.ports[1])}
}

// command is a kvrouter command a test runs in process (runOnPorts).
type command struct {
	ports     []int
	out, errb *syncBuf
	done      chan int // its exit code
	stop      context.CancelFunc
}

// port is the command's first port.
func (c *command) port() int { return c.ports[0] }

// runOnPort is runOnPorts for a command on one port, first on port.
func runOnPort(t *testing.T, port int, args func(port int) []string, ready func(c *command) bool) *command {
	t.Helper()
	return runOnPorts(t, []int{port}, 1, func(p []int) []string { return args(p[0]) }, ready)
}

// runOnPorts runs the command args gives for n consecutive ports (first
// on ports, or on free ones when ports is nil) until ready holds for it
// (ready may read its ports and its output). The ports are released
// before the command binds them, and they come from the ephemeral range
// that other tests' connections draw their local ports from: a port taken
// meanwhile makes the command exit with "address already in use" (how
// TestServeEmbeddedAuth and TestServeOpenAIAddrAndGateway failed in CI),
// and it runs again on new ports, up to three times. Any other exit before
// ready fails the test with the command's stderr. args runs on the
// caller's goroutine, once per attempt.
func runOnPorts(t *testing.T, ports []int, n int, args func(ports []int) []string, ready func(c *command) bool) *command {
	t.Helper()
	for attempt := 1; ; attempt++ {
		if ports == nil {
			base := testutil.FreePorts(t, n)
			for i := range n {
				ports = append(ports, base+i)
			}
		}
		ctx, stop := context.WithCancel(context.Background())
		c := &command{ports: ports, out: &syncBuf{}, errb: &syncBuf{}, done: make(chan int, 1), stop: stop}
		a := args(ports)
		go func() { c.done <- run(ctx, a, c.out, c.errb) }()
		exit := -1
		testutil.Eventually(t, 20*time.Second, func() bool {
			select {
			case exit = <-c.done:
				return true
			default:
			}
			return ready(c)
		}, func() string {
			return fmt.Sprintf("%s on ports %v never became ready; its stdout: %s; stderr: %s", a[0], ports, c.out, c.errb)
		})
		if exit < 0 {
			return c
		}
		stop()
		if attempt < 3 && strings.Contains(c.errb.String(), "address already in use") {
			t.Logf("%s on ports %v: a port was taken before it bound it; again on new ports: %s", a[0], ports, c.errb)
			ports = nil
			continue
		}
		t.Fatalf("%s exited %d before it was ready: %s", a[0], exit, c.errb)
	}
}

// probeClient is what the helpers that wait for a command's port use: a
// port another listener took may accept a connection and never answer.
var probeClient = &http.Client{Timeout: 2 * time.Second}

// answers reports whether GET url answers status.
func answers(url string, status int) bool {
	resp, err := probeClient.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == status
}

// serve with an embedded NATS server and worker --sim in another "process"
// connected to it: route over HTTP, then stop both with their contexts.
func TestServeAndWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, a replica and workers")
	}
	srv := startServe(t, 2, func(p []int) []string {
		return []string{"serve", "--embedded-nats", "--embedded-listen", fmt.Sprintf("127.0.0.1:%d", p[0]),
			"--http-addr", fmt.Sprintf("127.0.0.1:%d", p[1]), "--models", "llama", "--log-level", "warn"}
	})
	natsPort, base := srv.ports[0], srv.base
	wctx, stopWorker := context.WithCancel(context.Background())
	var workerOut, workerErr syncBuf
	workerDone := make(chan int, 1)
	go func() {
		workerDone <- run(wctx, []string{"worker", "--sim", "--count", "2", "--model", "llama", "--speedup", "20",
			"--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "--log-level", "warn"}, &workerOut, &workerErr)
	}()
	testutil.Eventually(t, 20*time.Second, func() bool {
		resp, err := http.Get(base + "/v1/workers")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var w struct{ Workers []json.RawMessage }
		return json.NewDecoder(resp.Body).Decode(&w) == nil && len(w.Workers) == 2
	}, func() string { return "workers never registered; worker stderr: " + workerErr.String() })
	resp, err := http.Post(base+"/v1/route", "application/json", strings.NewReader(`{"model":"llama","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"session_id":"s"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"endpoint":"kvr.worker.llama.sim-`) {
		t.Fatalf("route: %d %s", resp.StatusCode, body)
	}
	// The replica lists the workers once they registered, which is before
	// fleet.Start returns and the banner is printed: a stop before that is
	// a stop during start-up (exit 0, no banner).
	testutil.Eventually(t, 20*time.Second, func() bool { return strings.Contains(workerOut.String(), "simulated workers") },
		func() string { return "no worker banner: " + workerOut.String() + workerErr.String() })
	stopWorker()
	if code := <-workerDone; code != 0 {
		t.Fatalf("worker exit %d: %s", code, workerErr.String())
	}
	srv.shutdown(t)
	if !strings.Contains(srv.out.String(), "ready") || !strings.Contains(workerOut.String(), "simulated workers") {
		t.Fatalf("banners: %q %q", srv.out, workerOut.String())
	}
}

func waitHTTP(t *testing.T, url string, status int, d time.Duration) {
	t.Helper()
	var last error
	testutil.Eventually(t, d, func() bool {
		resp, err := probeClient.Get(url)
		if last = err; err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == status
	}, func() string { return fmt.Sprintf("%s never answered %d (last err %v)", url, status, last) })
}

// A tiny demo run on each path: the comparison table comes out with both
// policies. On the real path (the default) every request is served through
// the gateway, kvrouter keeps every session on one worker while
// round-robin, without session ids, does not, and both have the routing
// time the gateway reported.
func TestDemoSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo workload twice per path")
	}
	for _, tc := range []struct {
		path string
		args []string
		want []string
	}{
		{"real", []string{"--scale", "0.25", "--turns", "3", "--speedup", "4", "--workers", "2"},
			[]string{`requests done +24/24 +24/24`, `sessions on one worker +8/8 `,
				// the gateway's Server-Timing, not "-": issue 29
				`routing decision p50 +[0-9.]+ ms +[0-9.]+ ms`}},
		{"nats", []string{"--path", "nats", "--scale", "0.1", "--speedup", "20", "--workers", "2"}, nil},
	} {
		t.Run(tc.path, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), append([]string{"demo", "--quiet"}, tc.args...), &out, &errOut)
			if code != 0 {
				t.Fatalf("demo exit %d: %s", code, errOut.String())
			}
			for _, want := range append([]string{`kvrouter \(sessions: hard\)`, `round-robin \(sessions: none\)`, "prefix-cache hit ratio", "TTFT p99", "sessions on one worker"}, tc.want...) {
				if !regexp.MustCompile(want).MatchString(out.String()) {
					t.Errorf("demo output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestPolicyFile(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/p.yaml"
	if err := os.WriteFile(good, []byte("policy:\n  name: two-tier\n  params: {cache_threshold: 0.4}\nscheduler:\n  thresholds: {queue_prefill_frac: 0.5}\n  queue: {order: wspt}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg host.Config
	if err := applyPolicyFile(&cfg, good); err != nil {
		t.Fatal(err)
	}
	if cfg.Policy.Name != "two-tier" || cfg.Scheduler.Thresholds.QueuePrefillFrac != 0.5 || !cfg.Scheduler.ThresholdsSet || cfg.Scheduler.Queue.Order.String() != "wspt" {
		t.Fatalf("policy file not applied: %+v %+v", cfg.Policy, cfg.Scheduler)
	}
	for name, body := range map[string]string{
		"unknown policy": "policy: {name: nope}\n",
		"unknown param":  "policy: {name: default, params: {temprature: 1}}\n",
		"bad yaml":       "policy: [\n",
		"bad scheduler":  "scheduler: {queue: {order: lifo}}\n",
	} {
		p := dir + "/bad.yaml"
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := applyPolicyFile(&host.Config{}, p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := applyPolicyFile(&host.Config{}, dir+"/missing.yaml"); err == nil {
		t.Error("missing file accepted")
	}
}

// The local prefill rule is on by default, off with --pd-local-prefill=false
// and always off behind an in-process SGLang gateway, whose decode servers
// cannot serve a whole request.
func TestServeLocalPrefillFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		off  bool
	}{
		{nil, false},
		{[]string{"--pd-local-prefill=false"}, true},
		{[]string{"--openai-addr", "127.0.0.1:0", "--openai-pd", "sglang"}, true},
		{[]string{"--openai-addr", "127.0.0.1:0", "--openai-pd", "vllm"}, false},
	} {
		c := newFlags("serve", "")
		f := addServeFlags(c)
		if err := c.parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.config(slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if cfg.PDNoLocalPrefill != tc.off {
			t.Errorf("%v: PDNoLocalPrefill %v, want %v", tc.args, cfg.PDNoLocalPrefill, tc.off)
		}
	}
}

// startServe runs serve again on new ports when one was taken before serve
// bound it (here the NATS port of its first attempt is held by the test).
func TestStartServeRetriesATakenPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and a replica")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	attempts := 0
	srv := startServe(t, 2, func(p []int) []string {
		if attempts++; attempts == 1 {
			p[0] = taken
		}
		return []string{"serve", "--embedded-nats", "--embedded-listen", fmt.Sprintf("127.0.0.1:%d", p[0]),
			"--http-addr", fmt.Sprintf("127.0.0.1:%d", p[1]), "--models", "m", "--log-level", "warn"}
	})
	srv.shutdown(t)
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2 (the first on a taken port)", attempts)
	}
}
