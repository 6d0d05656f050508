package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
)

// queueForever keeps every route waiting (a request queued in the router)
// until its caller gives up, and reports the cancel that follows.
type queueForever struct {
	routeTo
	waiting  chan string    // request ids now waiting
	canceled chan [2]string // (request id, key) of each cancel
}

func (q *queueForever) Route(ctx context.Context, req *api.RouteRequest, _ *api.RouteResponse) error {
	q.waiting <- req.RequestID
	<-ctx.Done()
	return ctx.Err()
}

func (q *queueForever) Cancel(_ context.Context, _, requestID, key string) error {
	q.canceled <- [2]string{requestID, key}
	return nil
}

// A client gone while its request waits in the router's queue: the gateway
// cancels it with the request key its id was made from, the only proof of
// ownership a replica accepts for a queued request.
func TestCancelQueuedCarriesKey(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"count":2,"max_model_len":100,"tokens":[1,2]}`)
	}))
	defer eng.Close()
	q := &queueForever{routeTo: routeTo{endpoint: eng.URL + "/v1"}, waiting: make(chan string, 1), canceled: make(chan [2]string, 1)}
	g, err := New(Config{ID: "gw-a", Router: q, Models: []string{testModel}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(g)
	defer gw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	var id string
	select {
	case id = <-q.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the router")
	}
	cancel()
	<-done
	select {
	case c := <-q.canceled:
		if c[0] != id || !strings.HasPrefix(id, "gw-a-") || !api.RequestKeyMatches(c[0], c[1]) {
			t.Fatalf("cancel of %q with key %q: want the waiting request %q and the key its id was made from", c[0], c[1], id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not cancel the queued request")
	}
}
