package host

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/router/api"
)

// One deadline bounds the whole route: when the bindings table cannot
// answer (here its leader reads go to an API prefix whose only responder
// never replies, as a bindings stream without a leader would), a session's
// route ends at its deadline_ms with 503 bindings_unavailable and a retry
// hint (Retry-After on HTTP, retry_after_ms in the NATS envelope), not
// after the table's own (here 1 min) timeout.
func TestRouteDeadlineCoversBindings(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and a replica")
	}
	const stallPrefix = "$JS.stall.API"
	st := startStack(t, stackOpts{workers: 1, replicas: 1, mutate: func(_ int, c *Config) {
		c.Bindings.StrictReads = true // every request reads the binding from the "leader"
		c.Bindings.APIPrefix = stallPrefix
		c.Bindings.OpTimeout = time.Minute
	}})
	silent := natstest.Connect(t, st.srv)
	if _, err := silent.Subscribe(stallPrefix+".>", func(*nats.Msg) {}); err != nil { // takes the request, never answers
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	st.waitWorkers(1)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // far above the deadline: a hung route fails here
	defer cancel()
	req := &api.RouteRequest{Model: testModel, TokenIDs: tokens(3, 64), SessionID: "stalled", DeadlineMS: 300}
	_, err := st.client.Route(ctx, req)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeBindingsUnavailable || ae.Status != http.StatusServiceUnavailable || ae.RetryAfterMS != BindingsRetryAfter.Milliseconds() {
		t.Fatalf("NATS route with stalled bindings: %v (%#v), want 503 %s with retry_after_ms %d", err, ae, api.CodeBindingsUnavailable, BindingsRetryAfter.Milliseconds())
	}

	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+st.replicas[0].HTTPAddr()+"/v1/route",
		bytes.NewReader(api.AppendRouteRequest(nil, req)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
		!bytes.Contains(body, []byte(`"code":"bindings_unavailable"`)) {
		t.Fatalf("HTTP route with stalled bindings: %d, Retry-After %q, %s; want 503, 1, bindings_unavailable",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	// Without a session nothing waits on the table: the route is served.
	if _, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(3, 64), DeadlineMS: 300}); err != nil {
		t.Fatalf("route without a session: %v", err)
	}
}
