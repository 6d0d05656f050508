package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

// sim serve --help documents every flag it defines, vLLM's included.
func TestSimServeHelpDocumentsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"sim", "serve", "--help"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	c := newFlags("t", "about")
	addLogFlags(c)
	addSimServeFlags(c)
	c.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(out.String(), "  --"+f.Name+" ") && !strings.Contains(out.String(), "  --"+f.Name+"\t") &&
			!regexp.MustCompile(`(?m)^  --`+regexp.QuoteMeta(f.Name)+`\b`).MatchString(out.String()) {
			t.Errorf("help lacks --%s", f.Name)
		}
	})
	for _, name := range []string{"host", "port", "block-size", "num-gpu-blocks", "max-model-len", "max-num-seqs",
		"max-num-batched-tokens", "speedup", "data-parallel-size", "kv-events-config", "count"} {
		if c.Lookup(name) == nil {
			t.Errorf("sim serve has no --%s", name)
		}
	}
}

// MODEL may come before, between or after the flags, as with vllm serve.
func TestSplitPositional(t *testing.T) {
	c := newFlags("t", "about")
	addSimServeFlags(c)
	for _, tc := range []struct {
		args  []string
		model string
		rest  []string
	}{
		{[]string{"m", "--port", "9"}, "m", []string{"--port", "9"}},
		{[]string{"--port", "9", "m"}, "m", []string{"--port", "9"}},
		{[]string{"--port=9", "m", "--count", "2"}, "m", []string{"--port=9", "--count", "2"}},
		{[]string{"--enforce-eager", "m"}, "m", []string{"--enforce-eager"}},
		{[]string{"--port", "9"}, "", []string{"--port", "9"}},
	} {
		model, rest := splitPositional(c.FlagSet, tc.args)
		if model != tc.model || !slices.Equal(rest, tc.rest) {
			t.Errorf("%q: got %q %q, want %q %q", tc.args, model, rest, tc.model, tc.rest)
		}
	}
}

func TestSimServeUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"sim"},
		{"sim", "serve"}, // no model
		{"sim", "serve", "m", "--model", "other"},
		{"sim", "serve", "m", "--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"kafka"}`},
		{"sim", "serve", "m", "--kv-events-config", `{not json`},
		{"sim", "serve", "m", "--count", "0"},
		{"sim", "serve", "m", "--port", "0", "--count", "2"},
		{"sim", "serve", "m", "--max-num-seqs", "0"},
		{"sim", "serve", "m", "--block-size", "0"},
		{"sim", "serve", "m", "--speedup", "0"},
		{"sim", "serve", "m", "--num-gpu-blocks", "1"}, // the engine wants >= 2
		{"sim", "serve", "m", "--no-such-flag"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, errOut.String())
		}
	}
}

// simChildEnv makes TestSimServeChild run the command: the parent test
// runs it in a child process so that it can send a real SIGTERM (and so
// that go-zeromq's PUB writer goroutine, which outlives its socket's Close
// in zmq4 v0.17.0, ends with the child instead of failing goleak here).
const simChildEnv = "KVR_TEST_SIM_SERVE_ARGS"

func TestSimServeChild(t *testing.T) {
	args := os.Getenv(simChildEnv)
	if args == "" {
		t.Skip("runs only as the child of TestSimServeRunsAndStopsOnSIGTERM")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var argv []string
	if err := json.Unmarshal([]byte(args), &argv); err != nil {
		t.Fatalf("%s: %v", simChildEnv, err)
	}
	os.Exit(run(ctx, argv, os.Stdout, os.Stderr))
}

// childProcess is a kvrouter command run by TestSimServeChild in a child
// process, its output kept for the test's messages.
type childProcess struct {
	cmd         *exec.Cmd
	out, errOut syncBuf
	exited      chan error // the exit, once (Wait's error)
}

// startChild runs `kvrouter argv...` in a child process and kills it at
// cleanup unless it has exited.
func startChild(t *testing.T, argv ...string) *childProcess {
	t.Helper()
	a, err := json.Marshal(argv)
	if err != nil {
		t.Fatal(err)
	}
	c := &childProcess{cmd: exec.Command(os.Args[0], "-test.run=^TestSimServeChild$"), exited: make(chan error, 1)}
	c.cmd.Env = append(os.Environ(), simChildEnv+"="+string(a))
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.errOut
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { c.exited <- c.cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		<-waited
	})
	return c
}

// output is the child's stdout and stderr, for failure messages.
func (c *childProcess) output() string {
	return "stdout " + c.out.String() + " stderr " + c.errOut.String()
}

// simChild is a `sim serve` child on ports the kernel chose (port 0), so
// that no parallel test can take them between choosing and binding.
type simChild struct {
	*childProcess
	url, events, replay string // http://host:port, and the rank 0 ZMQ endpoints
}

// simChildArgs are sim serve's flags for a small engine with KV events
// and replay on, every port chosen by the kernel.
func simChildArgs(model string) []string {
	return []string{"sim", "serve", model, "--host", "127.0.0.1", "--port", "0", "--speedup", "100",
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","topic":"kv"}`,
		"--log-level", "warn"}
}

// startSimChild runs sim serve with argv (ports 0, KV events with replay)
// and waits for its start-up line.
func startSimChild(t *testing.T, argv ...string) *simChild {
	t.Helper()
	e := &simChild{childProcess: startChild(t, argv...)}
	started := regexp.MustCompile(`on http://(127\.0\.0\.1:\d+).*rank 0 events (tcp://\S+) replay (tcp://\S+)`)
	testutil.Eventually(t, 60*time.Second, func() bool {
		select {
		case err := <-e.exited:
			t.Fatalf("sim serve exited (%v) before its start-up line; %s", err, e.output())
		default:
		}
		return started.MatchString(e.out.String())
	}, func() string { return "no start-up line with the event endpoints; " + e.output() })
	m := started.FindStringSubmatch(e.out.String())
	e.url, e.events, e.replay = "http://"+m[1], m[2], m[3]
	return e
}

// sim serve answers vLLM's endpoints with vLLM's flags and KV events on,
// publishes the events on ZMQ, and exits 0 on SIGTERM.
func TestSimServeRunsAndStopsOnSIGTERM(t *testing.T) {
	e := startSimChild(t, "sim", "serve", "Qwen/Qwen3-0.6B", "--host", "127.0.0.1", "--port", "0",
		"--block-size", "16", "--num-gpu-blocks", "512", "--max-model-len", "2048", "--max-num-seqs", "8",
		"--max-num-batched-tokens", "1024", "--speedup", "100", "--gpu-memory-utilization", "0.8", "--enable-prefix-caching",
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","topic":"kv"}`,
		"--log-level", "warn")
	base, replayAt := e.url, e.replay

	// A late joiner replays from seq 0 and finds the batches of the request.
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"Qwen/Qwen3-0.6B","prompt":"`+strings.Repeat("hello ", 8)+`","max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"completion_tokens":4`) {
		t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}
	rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := vllmzmq.Replay(rctx, replayAt, 0)
	if err != nil {
		t.Fatalf("replay from %s: %v", replayAt, err)
	}
	if len(rep.Batches) == 0 {
		t.Fatalf("replay from %s returned no batches after a 48-token prompt was cached", replayAt)
	}

	resp, err = client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `vllm:cache_config_info{block_size="16",engine="0",model_name="Qwen/Qwen3-0.6B",num_gpu_blocks="512"} 1`) {
		t.Fatalf("/metrics lacks the cache config of the flags:\n%s", body)
	}
	client.CloseIdleConnections()

	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-e.exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; %s", err, e.output())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sim serve did not stop within 30 s of SIGTERM")
	}
}

// --count 2 runs two engines in one process, each on its own HTTP port with
// its own cache: a prompt cached on the first is cold on the second.
func TestSimServeCountEnginesOnConsecutivePorts(t *testing.T) {
	// The second engine's port (port+1) is not reserved: another test
	// may take it between freePort and the bind. Such a start fails with
	// "address already in use" and is tried again on another port
	// (runOnPort).
	engines := runOnPort(t, freePort(t), func(port int) []string {
		return []string{"sim", "serve", "m", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--count", "2",
			"--speedup", "100", "--log-level", "warn"}
	}, func(c *command) bool { return strings.Count(c.out.String(), "on http://") == 2 })
	defer engines.stop()
	port := engines.port()
	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()
	cached := func(p int) string {
		t.Helper()
		resp, err := client.Post("http://127.0.0.1:"+strconv.Itoa(p)+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"`+strings.Repeat("same prompt ", 6)+`","max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return strconv.Itoa(r.Usage.PromptTokensDetails.CachedTokens)
	}
	if got := []string{cached(port), cached(port), cached(port + 1)}; !slices.Equal(got, []string{"0", "64", "0"}) {
		t.Fatalf("cached tokens on engine 0, engine 0 again, engine 1: %v; want [0 64 0]", got)
	}
	engines.stop()
	if code := <-engines.done; code != 0 {
		t.Fatalf("exit %d: %s", code, engines.errb)
	}
}
