package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvrouter/kvrouter/router/api"
)

// The router's bindings_unavailable reaches the OpenAI client as 503 with
// Retry-After and the router's code.
func TestBindingsUnavailablePassesRetryAfter(t *testing.T) {
	e := api.NewError(api.CodeBindingsUnavailable, "bindings table did not answer", nil)
	e.RetryAfterMS = 1000
	g, err := New(Config{Router: fakeRouter{err: e, engine: refusingEndpoint(t)}, Models: []string{testModel}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(g)
	defer s.Close()
	resp, eb := post(t, s.URL, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("status %d, Retry-After %q (%+v); want 503 and 1", resp.StatusCode, resp.Header.Get("Retry-After"), eb)
	}
}
