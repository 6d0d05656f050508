package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/jskv"
	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers"
)

// bridge --help documents every flag it defines.
func TestBridgeHelpDocumentsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"bridge", "--help"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, name := range []string{"engine-url", "kv-events", "kv-replay", "topic", "model", "worker-id", "data-parallel-size",
		"dp-port-offset", "engine-format", "block-size", "router-block-size", "metrics-interval", "http-addr", "nats-url", "engine-keyed"} {
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
	// The engine runs in a child process (zmq4's PUB writer outlives
	// Close, see simChildEnv); the bridge opens no PUB socket. Every
	// port is the kernel's choice, printed at start.
	sim := startSimChild(t, simChildArgs("m")...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var brOut, brErr syncBuf
	brDone := make(chan int, 1)
	go func() {
		brDone <- run(ctx, []string{"bridge", "--model", "m", "--embedded-nats", "--embedded-listen", "",
			"--engine-url", sim.url, "--kv-events", sim.events, "--kv-replay", sim.replay,
			"--topic", "kv", "--http-addr", "127.0.0.1:0", "--health-interval", "100ms",
			"--drain-timeout", "2s", "--log-level", "warn"}, &brOut, &brErr)
	}()
	listening := regexp.MustCompile(`/metrics on (http://\S+)`)
	base := ""
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	testutil.Eventually(t, 30*time.Second, func() bool {
		if base == "" {
			m := listening.FindStringSubmatch(brOut.String())
			if m == nil {
				return false
			}
			base = m[1]
		}
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, func() string {
		return "readyz 200; bridge stdout " + brOut.String() + " stderr " + brErr.String() + "; engine " + sim.output()
	})
	resp, err := client.Get(base + "/metrics")
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

// SIGTERM drains a registered bridge: it marks itself draining, deregisters
// (the registry key is deleted) and exits 0. The NATS server is this
// test's, so the key's fate is read after the bridge has gone, not raced
// against the shutdown of a server embedded in the bridge.
func TestBridgeDrainsOnSIGTERM(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.JetStream(t, srv)
	ctx := context.Background()
	if _, err := kvevents.SetUpStream(ctx, js, kvevents.StreamConfig{Name: kvevents.DefaultStream, Prefix: kvevents.DefaultPrefix}, jskv.Owner{}); err != nil {
		t.Fatal(err)
	}
	kv, err := workers.EnsureBucket(ctx, js, workers.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sim := startSimChild(t, simChildArgs("m")...)
	// TestSimServeChild runs any command line it is given.
	br := startChild(t, "bridge", "--model", "m", "--worker-id", "wsig", "--nats-url", srv.ClientURL(),
		"--engine-url", sim.url, "--kv-events", sim.events, "--kv-replay", sim.replay,
		"--topic", "kv", "--http-addr", "", "--health-interval", "100ms", "--drain-timeout", "2s", "--log-level", "warn")
	key := workers.KeyFor("wsig")
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := kv.Get(ctx, key)
		return err == nil
	}, func() string { return "the bridge to register wsig; its " + br.output() })
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch, err := kv.Watch(wctx, key, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	if err := br.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-br.exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; %s", err, br.output())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the bridge did not exit within 30 s of SIGTERM (drain timeout 2 s); %s", br.output())
	}
	if _, err := kv.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after the exit the registry key is %v, want deleted; %s", err, br.output())
	}
	// The watch saw the draining state before the delete.
	var states []string
	testutil.Eventually(t, 10*time.Second, func() bool {
		for {
			select {
			case e := <-watch.Updates():
				if e == nil {
					continue
				}
				if e.Operation() != jetstream.KeyValuePut {
					return true
				}
				if info, err := workers.DecodeInfo(e.Value()); err == nil {
					states = append(states, string(info.State))
				}
			default:
				return false
			}
		}
	}, func() string { return fmt.Sprintf("the watch to see the delete (states seen %v)", states) })
	if !slices.Contains(states, string(workers.StateDraining)) {
		t.Errorf("states seen before the delete %v, want draining first", states)
	}
}
