package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/internal/testutil"
)

// serve --embedded-nats listening beyond loopback: credentials are
// generated into the data dir, a worker without them is refused, a worker
// with --nats-password-file registers; --embedded-auth off there is refused.
func TestServeEmbeddedAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, a replica and a worker")
	}
	var out, errb syncBuf
	code := run(context.Background(), []string{"serve", "--embedded-nats", "--embedded-listen", "0.0.0.0:0", "--embedded-auth", "off",
		"--http-addr", "", "--models", "m"}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), natsconn.ErrOpenListen.Error()) {
		t.Fatalf("--embedded-auth off on 0.0.0.0: exit %d, stderr %q", code, errb.String())
	}

	dir := t.TempDir()
	natsPort, httpPort := freePort(t), freePort(t)
	sctx, stopServe := context.WithCancel(context.Background())
	var serveOut, serveErr syncBuf
	serveDone := make(chan int, 1)
	go func() {
		serveDone <- run(sctx, []string{"serve", "--embedded-nats", "--embedded-listen", fmt.Sprintf("0.0.0.0:%d", natsPort),
			"--data-dir", dir, "--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--models", "m", "--log-level", "warn"}, &serveOut, &serveErr)
	}()
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitHTTP(t, base+"/readyz", 200, 20*time.Second)
	pwFile := filepath.Join(dir, natsconn.PasswordFileName)
	if !strings.Contains(serveErr.String(), "generated credentials") {
		t.Errorf("the generated credentials were not printed: %s", serveErr.String())
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	var wout, werr syncBuf
	if code := run(context.Background(), []string{"worker", "--sim", "--count", "1", "--model", "m", "--nats-url", url}, &wout, &werr); code == 0 ||
		!strings.Contains(strings.ToLower(werr.String()), "authorization") {
		t.Fatalf("worker without credentials: exit %d, stderr %q", code, werr.String())
	}
	wctx, stopWorker := context.WithCancel(context.Background())
	workerDone := make(chan int, 1)
	go func() {
		workerDone <- run(wctx, []string{"worker", "--sim", "--count", "1", "--model", "m", "--nats-url", url,
			"--nats-user", natsconn.GeneratedUser, "--nats-password-file", pwFile, "--log-level", "warn"}, &wout, &werr)
	}()
	testutil.Eventually(t, 20*time.Second, func() bool {
		resp, err := http.Get(base + "/v1/workers")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var w struct{ Workers []json.RawMessage }
		return json.NewDecoder(resp.Body).Decode(&w) == nil && len(w.Workers) == 1
	}, func() string { return "the worker with the generated credentials never registered: " + werr.String() })
	stopWorker()
	if code := <-workerDone; code != 0 {
		t.Fatalf("worker exit %d: %s", code, werr.String())
	}
	stopServe()
	if code := <-serveDone; code != 0 {
		t.Fatalf("serve exit %d: %s", code, serveErr.String())
	}
}
