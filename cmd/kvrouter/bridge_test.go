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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workers"
)

// bridge --help documents every flag it defines.
func TestBridgeHelpDocumentsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"bridge", "--help"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, name := range []string{"engine-url", "kv-events", "kv-replay", "topic", "model", "worker-id", "data-parallel-size",
		"dp-port-offset", "engine-format", "block-size", "router-block-size", "metrics-interval", "http-addr", "nats-url"} {
		if !regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(name) + `\b`).MatchString(out.String()) {
			t.Errorf("help lacks --%s", name)
		}
	}
	c := newFlags("t", "about")
	addNATSFlags(c, false)
	c.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(out.String(), "  --"+f.Name+" ") {
			t.Errorf("help lacks the NATS flag --%s", f.Name)
		}
	})
}

func TestBridgeUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--model is required"},
		{[]string{"--model", "m", "--engine-url", "not a url"}, "--engine-url"},
		{[]string{"--model", "m", "--engine-format", "tgi", "--embedded-nats", "--embedded-listen", ""}, "engine format"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"bridge"}, tc.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// defaultWorkerID is stable and names the engine's port.
func TestDefaultWorkerID(t *testing.T) {
	a, err := defaultWorkerID("http://10.0.0.5:8001")
	if err != nil || !strings.HasSuffix(a, "-8001") {
		t.Fatalf("%q %v", a, err)
	}
	if b, _ := defaultWorkerID("http://10.0.0.5:8001/"); b != a {
		t.Fatalf("%q != %q", b, a)
	}
}

// sim serve and the bridge, as a user runs them: the bridge waits for the
// engine, registers (readyz 200), and stops cleanly when its context ends
// (what SIGTERM does through signal.NotifyContext in main).
func TestBridgeJoinsSimServe(t *testing.T) {
	simPort, evPort, httpPort := freePort(t), freePort(t), freePort(t)
	repPort := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var brOut, brErr syncBuf
	brDone := make(chan int, 1)
	cfg := `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:` + strconv.Itoa(evPort) +
		`","replay_endpoint":"tcp://*:` + strconv.Itoa(repPort) + `","topic":"kv"}`
	// The engine runs in a child process (zmq4's PUB writer outlives
	// Close, see simChildEnv); the bridge opens no PUB socket.
	argv, _ := json.Marshal([]string{"sim", "serve", "m", "--host", "127.0.0.1", "--port", strconv.Itoa(simPort),
		"--speedup", "100", "--kv-events-config", cfg, "--log-level", "warn"})
	child := exec.Command(os.Args[0], "-test.run=^TestSimServeChild$")
	child.Env = append(os.Environ(), simChildEnv+"="+string(argv))
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	go func() {
		brDone <- run(ctx, []string{"bridge", "--model", "m", "--embedded-nats", "--embedded-listen", "",
			"--engine-url", "http://127.0.0.1:" + strconv.Itoa(simPort),
			"--kv-events", "tcp://127.0.0.1:" + strconv.Itoa(evPort), "--kv-replay", "tcp://127.0.0.1:" + strconv.Itoa(repPort),
			"--topic", "kv", "--http-addr", "127.0.0.1:" + strconv.Itoa(httpPort), "--health-interval", "100ms",
			"--drain-timeout", "2s", "--log-level", "warn"}, &brOut, &brErr)
	}()
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	testutil.Eventually(t, 20*time.Second, func() bool {
		resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(httpPort) + "/readyz")
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, func() string { return "readyz 200; bridge stdout " + brOut.String() + " stderr " + brErr.String() })
	resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(httpPort) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "kvr_bridge_engine_scrape_age_seconds") {
		t.Fatalf("bridge /metrics lacks the scrape age:\n%s", body)
	}
	client.CloseIdleConnections()
	cancel()
	select {
	case code := <-brDone:
		if code != 0 {
			t.Errorf("bridge exit %d; stderr %s", code, brErr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("bridge did not stop")
	}
}

// SIGTERM drains a registered bridge: it deregisters (the registry key is
// gone) and exits 0.
func TestBridgeDrainsOnSIGTERM(t *testing.T) {
	simPort, evPort, repPort, natsPort := freePort(t), freePort(t), freePort(t), freePort(t)
	cfg := `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:` + strconv.Itoa(evPort) +
		`","replay_endpoint":"tcp://*:` + strconv.Itoa(repPort) + `","topic":"kv"}`
	child := func(env, test string, argv []string, out io.Writer) *exec.Cmd {
		a, _ := json.Marshal(argv)
		c := exec.Command(os.Args[0], "-test.run=^"+test+"$")
		c.Env = append(os.Environ(), env+"="+string(a))
		c.Stdout, c.Stderr = out, out
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var simOut, brOut syncBuf
	sim := child(simChildEnv, "TestSimServeChild", []string{"sim", "serve", "m", "--host", "127.0.0.1",
		"--port", strconv.Itoa(simPort), "--speedup", "100", "--kv-events-config", cfg, "--log-level", "warn"}, &simOut)
	defer func() { sim.Process.Kill(); sim.Wait() }()
	// TestSimServeChild runs any command line it is given.
	br := child(simChildEnv, "TestSimServeChild", []string{"bridge", "--model", "m", "--worker-id", "wsig",
		"--embedded-nats", "--embedded-listen", "127.0.0.1:" + strconv.Itoa(natsPort),
		"--engine-url", "http://127.0.0.1:" + strconv.Itoa(simPort),
		"--kv-events", "tcp://127.0.0.1:" + strconv.Itoa(evPort), "--kv-replay", "tcp://127.0.0.1:" + strconv.Itoa(repPort),
		"--topic", "kv", "--http-addr", "", "--health-interval", "100ms", "--drain-timeout", "2s", "--log-level", "warn"}, &brOut)
	exited := make(chan error, 1)
	go func() { exited <- br.Wait() }()
	defer func() {
		if br.ProcessState == nil {
			br.Process.Kill()
			<-exited
		}
	}()
	var kv jetstream.KeyValue
	var conn *nats.Conn
	testutil.Eventually(t, 30*time.Second, func() bool {
		nc, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(natsPort), nats.MaxReconnects(0))
		if err != nil {
			return false
		}
		js, _ := jetstream.New(nc)
		if kv, err = js.KeyValue(context.Background(), workers.DefaultBucket); err != nil {
			nc.Close()
			return false
		}
		if _, err := kv.Get(context.Background(), workers.KeyFor("wsig")); err != nil {
			nc.Close()
			return false
		}
		conn = nc
		return true
	}, func() string { return "the bridge to register wsig; its output: " + brOut.String() })
	wctx, stopWatch := context.WithCancel(context.Background())
	defer func() { stopWatch(); conn.Close() }()
	watch, err := kv.Watch(wctx, workers.KeyFor("wsig"), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	if err := br.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var states []string
	deregistered := false
	timeout := time.After(20 * time.Second)
	for !deregistered {
		select {
		case e := <-watch.Updates():
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				deregistered = true
				break
			}
			info, err := workers.DecodeInfo(e.Value())
			if err == nil {
				states = append(states, string(info.State))
			}
		case <-timeout:
			t.Fatalf("not deregistered within 20 s of SIGTERM (states seen %v); output %s", states, brOut.String())
		}
	}
	if !slices.Contains(states, string(workers.StateDraining)) {
		t.Errorf("states seen before the delete %v, want draining first", states)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; output %s", err, brOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the bridge did not exit after SIGTERM")
	}
}
