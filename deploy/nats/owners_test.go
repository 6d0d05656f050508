package natsauth_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	natsauth "github.com/kvrouter/kvrouter/deploy/nats"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
)

// Issue 25, fences per client: two gateways with users of their own
// (natsauth.WithGatewayUser) share the gateway role. Neither can free,
// cancel or mark the other's bookings, running or queued, nor read the
// other's replies; each one's own calls succeed; an operator frees anything.
func TestGatewaysOwnTheirBookings(t *testing.T) {
	f := startFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ua, _ := natsauth.GatewayUserOf("gw-a")
	ub, _ := natsauth.GatewayUserOf("gw-b")
	gwA, gwB := connect(t, f.srv, ua.User, ua.Inbox), connect(t, f.srv, ub.User, ub.Inbox)
	a, b := api.NewClient(gwA.nc, "", nil), api.NewClient(gwB.nc, "", nil)
	admin := api.NewClient(connect(t, f.srv, "admin", "_INBOX_admin").nc, "", nil)
	testutil.Eventually(t, 15*time.Second, func() bool {
		ws, err := a.Workers(ctx, model)
		return err == nil && len(ws.Workers) == 2
	}, func() string { return "gateway A does not see both workers" })

	// A's running booking fills worker A's KV cache with its prompt (the
	// default books no output blocks); A's second request,
	// pinned there too, waits in the queue.
	pin := &api.WorkerRef{Worker: workerA}
	running, err := a.Route(ctx, &api.RouteRequest{Model: model, TokenIDs: tokens(1024 * 16), Pin: pin})
	if err != nil {
		t.Fatalf("gateway A routes: %v", err)
	}
	queuedID, queuedKey := api.NewRequestID(ua.Instance + "-")
	queued := make(chan error, 1)
	go func() {
		_, err := a.Route(ctx, &api.RouteRequest{Model: model, RequestID: queuedID, TokenIDs: tokens(32), Pin: pin, DeadlineMS: 30_000})
		queued <- err
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return f.replica.Waiting(model) == 1 },
		func() string { return fmt.Sprintf("%d requests waiting, want A's one", f.replica.Waiting(model)) })

	t.Run("B cannot free, cancel or mark A's bookings", func(t *testing.T) {
		_, keyB := api.NewRequestID(ub.Instance + "-")
		guess := strings.Repeat("0", len(running.Fence))
		for _, c := range []struct {
			name string
			call func() error
			want error
		}{
			{"cancel A's queued request without a key", func() error { return b.Cancel(ctx, model, queuedID, "") }, api.ErrBadRequest},
			{"cancel A's queued request with B's key", func() error { return b.Cancel(ctx, model, queuedID, keyB) }, api.ErrNotFound},
			{"cancel A's running request without a fence", func() error { return b.Cancel(ctx, model, running.RequestID, "") }, api.ErrBadRequest},
			{"cancel A's running request with a guessed fence", func() error {
				return b.Cancel(ctx, model, running.RequestID, guess)
			}, api.ErrNotFound},
			{"free A's running request with a guessed fence", func() error {
				return b.Free(ctx, model, &api.RouteResponse{RequestID: running.RequestID, Replica: running.Replica, Fence: guess})
			}, api.ErrNotFound},
			{"free A's running request without a fence", func() error {
				return b.Free(ctx, model, &api.RouteResponse{RequestID: running.RequestID, Replica: running.Replica})
			}, api.ErrBadRequest},
			{"mark A's running request prefilled", func() error {
				return b.PrefillDone(ctx, model, &api.RouteResponse{RequestID: running.RequestID, Attempt: running.Attempt, Fence: guess})
			}, api.ErrNotFound},
		} {
			if err := c.call(); !errors.Is(err, c.want) {
				t.Errorf("gateway B: %s: %v, want %v", c.name, err, c.want)
			}
		}
		if n := f.replica.Waiting(model); n != 1 {
			t.Fatalf("%d requests waiting after B's attempts, want A's one", n)
		}
	})

	t.Run("B cannot read A's replies or act as an operator", func(t *testing.T) {
		for _, subject := range []string{ua.Inbox + ".>", "_INBOX_gateway.>", "_INBOX_admin.>", "_INBOX.>"} {
			if _, err := gwB.nc.SubscribeSync(subject); err != nil {
				t.Fatal(err)
			}
		}
		body, _ := json.Marshal(&api.LifecycleRequest{RequestID: running.RequestID, Replica: running.Replica})
		if err := gwB.nc.PublishRequest(api.AdminSubject("", api.OpFree, model), gwB.nc.NewRespInbox(), body); err != nil {
			t.Fatal(err)
		}
		if err := gwB.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, subject := range []string{ua.Inbox + ".>", "_INBOX_gateway.>", "_INBOX_admin.>", "_INBOX.>", api.AdminSubject("", api.OpFree, model)} {
			testutil.Eventually(t, 5*time.Second, func() bool { return gwB.refused(subject) },
				func() string { return fmt.Sprintf("gateway B: %s was not refused: %v", subject, gwB.violations()) })
		}
		// Through the client: B's operator call is refused before any
		// replica sees it, so it gets no answer.
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		if err := b.Admin(rctx, api.OpFree, model, running.RequestID, running.Replica); err == nil {
			t.Fatal("gateway B freed A's booking as an operator")
		}
	})

	t.Run("each gateway's own calls succeed", func(t *testing.T) {
		if err := a.PrefillDone(ctx, model, running); err != nil {
			t.Fatalf("A marks its running request: %v", err)
		}
		if err := a.Cancel(ctx, model, queuedID, queuedKey); err != nil {
			t.Fatalf("A cancels its queued request with its key: %v", err)
		}
		if err := <-queued; !errors.Is(err, api.ErrCanceled) {
			t.Fatalf("A's queued route: %v, want canceled", err)
		}
		own, err := b.Route(ctx, &api.RouteRequest{Model: model, TokenIDs: tokens(16), Pin: &api.WorkerRef{Worker: workerB}})
		if err != nil {
			t.Fatalf("B routes: %v", err)
		}
		if err := b.Free(ctx, model, own); err != nil {
			t.Fatalf("B frees its own booking: %v", err)
		}
	})

	t.Run("an operator frees anything", func(t *testing.T) {
		if err := admin.Admin(ctx, api.OpFree, model, running.RequestID, running.Replica); err != nil {
			t.Fatalf("the operator frees A's booking: %v", err)
		}
		if err := a.Free(ctx, model, running); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("A's free after the operator's: %v, want not found", err)
		}
	})
	for _, r := range []*role{f.router, gwA} {
		if v := r.violations(); len(v) > 0 {
			t.Errorf("user %s hit permission violations doing its job:\n%s", r.user, strings.Join(v, "\n"))
		}
	}
}

func TestWithGatewayUser(t *testing.T) {
	raw, err := os.ReadFile("auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(raw)
	for _, bad := range []string{"", "gw.a", "gw a", "-gw", "gw*", strings.Repeat("g", 65)} {
		if _, _, err := natsauth.WithGatewayUser(conf, bad); err == nil {
			t.Errorf("instance %q accepted", bad)
		}
	}
	out, u, err := natsauth.WithGatewayUser(conf, "gw-a")
	if err != nil {
		t.Fatal(err)
	}
	if u.User != "gateway-gw-a" || u.Inbox != "_INBOX_gateway_gw-a" || u.PasswordVar != "NATS_GATEWAY_GW_A_PASSWORD" || u.Perms != "GATEWAY_GW_A" {
		t.Fatalf("gateway user %+v", u)
	}
	if _, _, err := natsauth.WithGatewayUser(out, "gw_a"); err == nil {
		t.Error("gw_a, whose block and variable are gw-a's, accepted after gw-a")
	}
	out, err = natsauth.WithoutSharedGateway(out)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "{user: gateway,") || !strings.Contains(out, "{user: gateway-gw-a, password: $NATS_GATEWAY_GW_A_PASSWORD, permissions: $GATEWAY_GW_A}") ||
		!strings.Contains(out, `subscribe = { allow = ["_INBOX_gateway_gw-a.>"] }`) {
		t.Fatalf("configuration without the shared gateway and with gw-a:\n%s", out)
	}
}
