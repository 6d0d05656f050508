package api_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/router/api"
)

// A request that finds no replica is retried within NoRouterWait, so a
// replica that subscribes meanwhile (a failover's reconnection) answers
// it; past the wait, or with a negative one, it fails with ErrNoRouter.
func TestClientRetriesNoResponders(t *testing.T) {
	srv := natstest.Start(t)
	cases := []struct {
		name      string
		wait      time.Duration
		subscribe time.Duration // when a replica appears; 0 = never
		want      error
	}{
		{name: "replica appears within the wait", wait: time.Second, subscribe: 100 * time.Millisecond},
		{name: "no replica", wait: 150 * time.Millisecond, want: api.ErrNoRouter},
		{name: "fail at once", wait: -1, subscribe: 100 * time.Millisecond, want: api.ErrNoRouter},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A model of its own per case: an earlier case's replica, whose
			// connection is still closing on the server, must not take
			// this case's request (it would answer nothing).
			model := fmt.Sprint("m", i)
			subject := api.RouteSubject("", model)
			req := &api.RouteRequest{Model: model, TokenIDs: []uint32{1, 2, 3}}
			client := api.NewClient(natstest.Connect(t, srv), "", nil)
			client.NoRouterWait = c.wait
			replica := natstest.Connect(t, srv)
			if c.subscribe > 0 {
				timer := time.AfterFunc(c.subscribe, func() {
					_, _ = replica.Subscribe(subject, func(m *nats.Msg) {
						_ = m.Respond([]byte(`{"worker":"w1","rank":0}`))
					})
					_ = replica.Flush()
				})
				defer timer.Stop()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := client.Route(ctx, req)
			switch {
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("err %v, want %v", err, c.want)
			case c.want == nil && (err != nil || resp.Worker != "w1"):
				t.Fatalf("resp %+v, err %v; want an answer from the replica", resp, err)
			}
		})
	}
}
