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

	var dir string
	srv := startServe(t, 2, func(p []int) []string {
		dir = t.TempDir() // fresh on a retry: serve generates its credentials into it
		return []string{"serve", "--embedded-nats", "--embedded-listen", fmt.Sprintf("0.0.0.0:%d", p[0]),
			"--data-dir", dir, "--http-addr", fmt.Sprintf("127.0.0.1:%d", p[1]), "--models", "m", "--log-level", "warn"}
	})
	natsPort, base := srv.ports[0], srv.base
	pwFile := filepath.Join(dir, natsconn.PasswordFileName)
	if !strings.Contains(srv.errb.String(), "generated credentials") {
		t.Errorf("the generated credentials were not printed: %s", srv.errb)
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
	srv.shutdown(t)
}
