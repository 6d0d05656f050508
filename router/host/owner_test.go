package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
)

// Tests of issue 25's fences per client: a request still queued is
// cancelled only with the request key its id was made from; a routed one
// with its fence or that key; an operator's subjects need neither.

// queueBehind books the whole KV cache of worker sim-0 with a long prompt
// (so it is busy) and
// routes a request pinned to it with a key-made id, which waits in the
// queue; it returns the blocker's reply, the waiting request's id and key,
// and where the waiting route's outcome arrives.
func queueBehind(t *testing.T, st *stack, client string) (blocker *api.RouteResponse, id, key string, done <-chan error) {
	t.Helper()
	ctx := ctxT(t)
	pin := &api.WorkerRef{Worker: "sim-0"}
	// The prompt's blocks are booked (the default books no output blocks:
	// a router knows max_tokens, not the reply's length).
	blocker, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 4096*16), Pin: pin})
	if err != nil {
		t.Fatal(err)
	}
	id, key = api.NewRequestID(client + "-")
	ch := make(chan error, 1)
	go func() {
		_, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, RequestID: id, TokenIDs: tokens(2, 64), Pin: pin, DeadlineMS: 30_000})
		ch <- err
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return st.replicas[0].Waiting(testModel) == 1 },
		func() string { return fmt.Sprintf("%d requests waiting, want 1", st.replicas[0].Waiting(testModel)) })
	return blocker, id, key, ch
}

func TestCancelQueuedNeedsKey(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	ctx := ctxT(t)
	blocker, id, key, done := queueBehind(t, st, "client-a")
	_, otherKey := api.NewRequestID("client-b-")
	for _, c := range []struct {
		name, fence string
		want        error
	}{
		{"no key", "", api.ErrBadRequest},
		{"another client's key", otherKey, api.ErrNotFound},
		{"the key's digest (the id's tail)", id[len(id)-32:], api.ErrNotFound},
		{"the blocker's fence", blocker.Fence, api.ErrNotFound},
	} {
		if err := st.client.Cancel(ctx, testModel, id, c.fence); !errors.Is(err, c.want) {
			t.Fatalf("cancel of a queued request with %s: %v, want %v", c.name, err, c.want)
		}
	}
	if n := st.replicas[0].Waiting(testModel); n != 1 {
		t.Fatalf("%d requests waiting after refused cancels, want 1", n)
	}
	if err := st.client.Cancel(ctx, testModel, id, key); err != nil {
		t.Fatalf("the owner's cancel with its key: %v", err)
	}
	if err := <-done; !errors.Is(err, api.ErrCanceled) {
		t.Fatalf("the cancelled request's route: %v, want canceled", err)
	}
	if err := st.client.Free(ctx, testModel, blocker); err != nil {
		t.Fatal(err)
	}
}

// The owner's cancel with its key also releases the booking once routed:
// what a client does when it gave up waiting just as the reply came.
func TestCancelRoutedWithKey(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	ctx := ctxT(t)
	id, key := api.NewRequestID("client-a-")
	resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, RequestID: id, TokenIDs: tokens(1, 64)})
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey := api.NewRequestID("client-b-")
	if err := st.client.Cancel(ctx, testModel, id, otherKey); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("cancel with another client's key: %v, want not found", err)
	}
	if err := st.client.Free(ctx, testModel, &api.RouteResponse{RequestID: id, Replica: resp.Replica, Fence: key}); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("free with the key instead of the fence: %v, want not found (the key proves ownership for cancel only)", err)
	}
	if err := st.client.Cancel(ctx, testModel, id, key); err != nil {
		t.Fatalf("the owner's cancel of its routed request with its key: %v", err)
	}
	if err := st.client.Free(ctx, testModel, resp); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("free after the cancel: %v, want not found", err)
	}
}

// An operator's calls (api.AdminSubject, kept to operators by NATS
// permissions) free or cancel anyone's request, routed or queued, on any
// replica (forwarded to the one holding it).
func TestAdminLifecycle(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	ctx := ctxT(t)
	blocker, id, _, done := queueBehind(t, st, "client-a")
	if err := st.client.Admin(ctx, api.OpCancel, testModel, id, ""); err != nil {
		t.Fatalf("operator cancels a queued request: %v", err)
	}
	if err := <-done; !errors.Is(err, api.ErrCanceled) {
		t.Fatalf("the cancelled request's route: %v, want canceled", err)
	}
	if err := st.client.Admin(ctx, api.OpFree, testModel, blocker.RequestID, blocker.Replica); err != nil {
		t.Fatalf("operator frees a routed request: %v", err)
	}
	if err := st.client.Free(ctx, testModel, blocker); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the owner's free after the operator's: %v, want not found", err)
	}
	// Through the queue group, a call for another replica is forwarded on
	// the operator's replica subject.
	data, _ := json.Marshal(&api.LifecycleRequest{RequestID: "nope", Replica: "ghost"})
	reply, err := st.nc.Request(api.AdminSubject("", api.OpFree, testModel), data, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if e := api.DecodeError(reply.Data); !errors.Is(e, api.ErrNotFound) || e.Field != "replica" {
		t.Fatalf("operator frees on a replica that is gone: %v, want not found (replica)", e)
	}
}
