package vllmapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/workers/sim"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testModel is the model every test engine serves.
const testModel = "sim-model"

// newTestServer starts an engine on the wall clock (running with Run) and
// its HTTP face on a loopback server (its Config changed by opts); both stop
// at the end of the test.
func newTestServer(t testing.TB, ec sim.Config, maxModelLen int, opts ...func(*Config)) (*httptest.Server, *sim.Engine) {
	cfg := Config{MaxModelLen: maxModelLen}
	for _, o := range opts {
		o(&cfg)
	}
	return newServerWith(t, ec, cfg)
}

// newServerWith is newTestServer with more of the face's settings (cfg's
// Engine is filled in).
func newServerWith(t testing.TB, ec sim.Config, cfg Config) (*httptest.Server, *sim.Engine) {
	t.Helper()
	hs, _, eng := newTestFace(t, ec, cfg)
	return hs, eng
}

// newTestFace is newTestServer with the face's Config (its Engine set
// here) and the face itself.
func newTestFace(t testing.TB, ec sim.Config, cfg Config) (*httptest.Server, *Server, *sim.Engine) {
	t.Helper()
	ec.Worker, ec.Model = "sim-0", testModel
	if ec.Speedup == 0 {
		ec.Speedup = 100
	}
	eng, err := sim.New(ec)
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- eng.Run(ctx) }()
	cfg.Engine = eng
	srv, err := New(cfg)
	if err != nil {
		_ = eng.Close(context.Background())
		cancel()
		<-ran
		t.Fatalf("New: %v", err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		hs.Close()
		_ = eng.Close(context.Background())
		cancel()
		<-ran
	})
	return hs, srv, eng
}

// post sends body to path and returns the status and the reply body.
func post(t testing.TB, hs *httptest.Server, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the reply: %v", path, err)
	}
	return resp.StatusCode, string(b)
}
