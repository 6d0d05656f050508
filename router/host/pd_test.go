package host

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workers"
)

// A PD route makes two decisions: the decode leg on a decode-capable worker
// under the session's binding, the prefill leg on a prefill-capable one,
// both booked until freed; a short prompt on a `both` worker is served
// whole; GET /v1/workers shows each worker's role.
func TestPDRoute(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	ctx := ctxT(t)
	for id, role := range map[string]workers.Role{"p-0": workers.RolePrefill, "d-0": workers.RoleDecode, "b-0": workers.RoleBoth} {
		reg, err := workers.Register(ctx, st.js, testRegistry(), workers.Info{ID: id, Model: testModel,
			Endpoint: "http://" + id, Ranks: []uint32{0}, BlockSize: st.replicas[0].cfg.BlockSize,
			KVBlocks: 4096, MaxBatchedTokens: 1 << 20, MaxSeqs: 256, Role: role, BootstrapPort: 8998})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Stop)
	}
	st.waitWorkers(3)
	ws, _ := st.replicas[0].Workers(testModel)
	for _, w := range ws.Workers {
		if want := map[string]string{"p-0": "prefill", "d-0": "decode", "b-0": "both"}[w.Worker]; w.Role != want {
			t.Errorf("worker %s role %q, want %q", w.Worker, w.Role, want)
		}
	}

	// A long prompt splits: decode on d-0 or b-0, prefill on p-0 or b-0, never the same worker.
	for i := range 6 {
		resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, SessionID: fmt.Sprint("s", i), TokenIDs: tokens(i, 2048), PD: true})
		if err != nil {
			t.Fatal(err)
		}
		if resp.PD != api.PDSplit || resp.Prefill == nil {
			t.Fatalf("long prompt: %+v, want a split", resp)
		}
		if resp.Worker == "p-0" || resp.Prefill.Worker == "d-0" || resp.Worker == resp.Prefill.Worker {
			t.Fatalf("split decode %s prefill %s", resp.Worker, resp.Prefill.Worker)
		}
		if resp.Binding == nil || resp.Binding.Worker != resp.Worker {
			t.Fatalf("the session binds the decode worker: %+v", resp.Binding)
		}
		if resp.Prefill.RequestID != resp.RequestID+api.PrefillSuffix || resp.Prefill.BootstrapPort != 8998 {
			t.Fatalf("prefill leg %+v", resp.Prefill)
		}
		st.waitWorker(resp.Prefill.Worker, func(ws api.WorkerStatus) bool { return !idle(ws) })
		if err := st.client.Free(ctx, testModel, resp.PrefillBooking()); err != nil {
			t.Fatalf("free the prefill leg: %v", err)
		}
		if err := st.client.Free(ctx, testModel, resp); err != nil {
			t.Fatalf("free the decode leg: %v", err)
		}
		for _, w := range []string{"p-0", "d-0", "b-0"} {
			st.waitWorker(w, idle)
		}
	}
	// A short prompt pinned to the both worker is served whole there.
	resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(99, 64), PD: true, Pin: &api.WorkerRef{Worker: "b-0"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.PD != api.PDSingle || resp.PDReason != api.PDReasonShort || resp.Prefill != nil || resp.Worker != "b-0" {
		t.Fatalf("short prompt: %+v, want single on b-0", resp)
	}
	if err := st.client.Free(ctx, testModel, resp); err != nil {
		t.Fatal(err)
	}
	// A request without pd never lands on the prefill-only worker.
	for i := range 8 {
		resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(200+i, 256)})
		if err != nil || resp.Worker == "p-0" || resp.PD != "" {
			t.Fatalf("whole request: %+v %v", resp, err)
		}
		_ = st.client.Free(ctx, testModel, resp)
	}
}

// startPDStack is one replica on a fake scheduler clock (with ttl as the
// booking TTL and the guard running every few milliseconds) and one
// prefill and one decode worker with maxBatched tokens per step.
func startPDStack(t *testing.T, ttl time.Duration, maxBatched int) (*stack, *testutil.Clock) {
	return startPDStackWith(t, ttl, maxBatched, true)
}

// startPDStackWith is startPDStack with the local prefill rule on or off.
func startPDStackWith(t *testing.T, ttl time.Duration, maxBatched int, local bool) (*stack, *testutil.Clock) {
	clock := testutil.NewClock(time.Now())
	st := startStack(t, stackOpts{replicas: 1, mutate: func(_ int, c *Config) {
		c.Scheduler.Now, c.Scheduler.BookingTTL, c.Scheduler.GuardInterval = clock.Now, ttl, 5*time.Millisecond
		c.PDNoLocalPrefill = !local
	}})
	ctx := ctxT(t)
	for id, role := range map[string]workers.Role{"p-0": workers.RolePrefill, "d-0": workers.RoleDecode} {
		reg, err := workers.Register(ctx, st.js, testRegistry(), workers.Info{ID: id, Model: testModel,
			Endpoint: "http://" + id, Ranks: []uint32{0}, BlockSize: st.replicas[0].cfg.BlockSize,
			KVBlocks: 4096, MaxBatchedTokens: maxBatched, MaxSeqs: 256, Role: role})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Stop)
	}
	st.waitWorkers(2)
	return st, clock
}

// The decode booking of a split route lives as a whole request's booking
// does: its expiry clock restarts at the decode leg's first token
// (prefill_done), not at the route, so a long prefill leg followed by a
// decode leg does not lose it. Here the prefill leg's booking, untouched
// since the route, expires while the decode booking, touched at its first
// token, is kept and freed.
func TestPDDecodeBookingOutlivesPrefillLeg(t *testing.T) {
	st, clock := startPDStack(t, 10*time.Second, 1<<20)
	ctx := ctxT(t)
	resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 2048), PD: true})
	if err != nil || resp.PD != api.PDSplit {
		t.Fatalf("route: %+v %v, want a split", resp, err)
	}
	clock.Advance(8 * time.Second) // the prefill leg runs, then the decode leg's first token
	if err := st.client.PrefillDone(ctx, testModel, resp); err != nil {
		t.Fatalf("decode leg's prefill_done: %v", err)
	}
	clock.Advance(8 * time.Second) // the decode leg streams on
	sched := st.replicas[0].models[testModel].sched
	testutil.Eventually(t, 10*time.Second, func() bool { return sched.Stats().Expired >= 1 },
		func() string { return "the prefill leg's booking never expired (the guard did not run)" })
	if n := sched.Stats().Expired; n != 1 {
		t.Fatalf("%d bookings expired, want only the prefill leg's", n)
	}
	if err := st.client.Free(ctx, testModel, resp); err != nil {
		t.Fatalf("free the decode leg after a long prefill leg: %v", err)
	}
}

// A split route's queue wait is the whole router queue, its prefill leg's
// wait included: the wait a client adds to the legs' times for the
// request's TTFT. The decode worker is not held up meanwhile: the pair is
// admitted only when a prefill worker has room, so a waiting route holds
// no decode booking, and a split's decode booking charges no prefill.
func TestPDQueueWaitCountsPrefillLeg(t *testing.T) {
	st, clock := startPDStackWith(t, time.Hour, 128, false) // busy at 8 × 128 tokens of prefill
	ctx := ctxT(t)
	first, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 2048), PD: true})
	if err != nil || first.PD != api.PDSplit {
		t.Fatalf("route: %+v %v, want a split", first, err)
	}
	type routed struct {
		resp *api.RouteResponse
		err  error
	}
	done := make(chan routed, 1)
	go func() {
		resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(2, 2048), PD: true})
		done <- routed{resp, err}
	}()
	r := st.replicas[0]
	testutil.Eventually(t, 10*time.Second, func() bool { return r.Waiting(testModel) == 1 },
		func() string { return "the second route's prefill leg does not wait" })
	st.waitWorker("d-0", func(ws api.WorkerStatus) bool {
		return ws.Load != nil && ws.Load.ActiveRequests == 1 && ws.Load.PrefillTokens == 0
	})
	if n := r.Waiting(testModel); n != 1 {
		t.Fatalf("%d routes wait, want the second", n)
	}
	if ws := workerStatus(st.replicas[0], "d-0"); ws.Load == nil || ws.Load.ActiveRequests != 1 {
		t.Fatalf("the decode worker holds %+v while the second route waits, want the first route's booking alone", ws.Load)
	}
	clock.Advance(5 * time.Second)
	if err := st.client.Free(ctx, testModel, first.PrefillBooking()); err != nil {
		t.Fatal(err)
	}
	second := <-done
	if second.err != nil || second.resp.PD != api.PDSplit {
		t.Fatalf("second route: %+v %v, want a split", second.resp, second.err)
	}
	if w := time.Duration(second.resp.QueueWaitUS) * time.Microsecond; w < 5*time.Second {
		t.Fatalf("queue wait %v, want the prefill leg's 5 s", w)
	}
	for _, rs := range []*api.RouteResponse{second.resp.PrefillBooking(), second.resp, first} {
		if err := st.client.Free(ctx, testModel, rs); err != nil {
			t.Fatal(err)
		}
	}
}

// A prefill leg that cannot be booked before the route's deadline fails
// the route (overloaded), as any route's wait does: the request is
// not sent whole to a decode-only worker, and the route leaves no booking
// behind.
func TestPDPrefillDeadlineFailsRoute(t *testing.T) {
	st, clock := startPDStackWith(t, time.Hour, 128, false)
	ctx := ctxT(t)
	first, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 2048), PD: true})
	if err != nil || first.PD != api.PDSplit {
		t.Fatalf("route: %+v %v, want a split", first, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(2, 2048), PD: true, DeadlineMS: 300})
		done <- err
	}()
	r := st.replicas[0]
	testutil.Eventually(t, 10*time.Second, func() bool { return r.Waiting(testModel) == 1 },
		func() string { return "the second route's prefill leg does not wait" })
	clock.Advance(time.Minute) // past the deadline (the scheduler's clock)
	err = <-done
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeOverloaded {
		t.Fatalf("second route: %v, want %s", err, api.CodeOverloaded)
	}
	if ws := workerStatus(st.replicas[0], "d-0"); ws.Load == nil || ws.Load.ActiveRequests != 1 {
		t.Fatalf("the decode worker holds %+v, want the first route's booking alone", ws.Load)
	}
	for _, rs := range []*api.RouteResponse{first.PrefillBooking(), first} {
		if err := st.client.Free(ctx, testModel, rs); err != nil {
			t.Fatal(err)
		}
	}
}

// The local prefill rule: with the prefill worker busy, a route goes
// whole to the decode worker while it has room by the queue threshold
// (prefill_busy, the prompt charged there as prefill, no prefill booking);
// once the decode worker is busy with that prefill too, the next pair
// waits for the prefill worker and splits, as without the rule. Each
// route's bookings free cleanly.
func TestPDLocalPrefillWhenPrefillBusy(t *testing.T) {
	st, clock := startPDStack(t, time.Hour, 128) // busy at 8 × 128 tokens of prefill
	ctx := ctxT(t)
	first, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 2048), PD: true})
	if err != nil || first.PD != api.PDSplit || first.Worker != "d-0" {
		t.Fatalf("first route: %+v %v, want a split", first, err)
	}
	local, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(2, 2048), PD: true})
	if err != nil || local.PD != api.PDSingle || local.PDReason != api.PDReasonPrefillBusy || local.Prefill != nil || local.Worker != "d-0" {
		t.Fatalf("second route: %+v %v, want single on d-0 (prefill_busy)", local, err)
	}
	st.waitWorker("d-0", func(ws api.WorkerStatus) bool {
		return ws.Load != nil && ws.Load.ActiveRequests == 2 && ws.Load.PrefillTokens == 2048
	})
	// Both sides busy now: the third pair waits for the prefill worker.
	done := make(chan *api.RouteResponse, 1)
	go func() {
		resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(3, 2048), PD: true})
		if err != nil {
			t.Errorf("third route: %v", err)
		}
		done <- resp
	}()
	r := st.replicas[0]
	testutil.Eventually(t, 10*time.Second, func() bool { return r.Waiting(testModel) == 1 },
		func() string { return "the third route does not wait with both sides busy" })
	// The prefill worker's leg ends, and so does the decode worker's local
	// prefill (its first token): both sides have room again.
	clock.Advance(time.Second)
	if err := st.client.Free(ctx, testModel, first.PrefillBooking()); err != nil {
		t.Fatal(err)
	}
	if err := st.client.PrefillDone(ctx, testModel, local); err != nil {
		t.Fatal(err)
	}
	third := <-done
	if third == nil || third.PD != api.PDSplit || third.Prefill == nil || third.Prefill.Worker != "p-0" {
		t.Fatalf("third route: %+v, want a split after the prefill worker freed", third)
	}
	for _, rs := range []*api.RouteResponse{third.PrefillBooking(), third, local, first} {
		if err := st.client.Free(ctx, testModel, rs); err != nil {
			t.Fatal(err)
		}
	}
	idle := func(ws api.WorkerStatus) bool {
		return ws.Load != nil && ws.Load.ActiveRequests == 0 && ws.Load.PrefillTokens == 0
	}
	for _, w := range []string{"p-0", "d-0"} {
		st.waitWorker(w, idle)
	}
}

// workerStatus is r's view of worker (zero if it does not know it).
func workerStatus(r *Replica, worker string) api.WorkerStatus {
	ws, _ := r.Workers(testModel)
	for _, w := range ws.Workers {
		if w.Worker == worker {
			return w
		}
	}
	return api.WorkerStatus{}
}

// serve_whole on a split route's decode booking (the gateway's fallback
// when the prefill leg failed) charges the decode worker the prompt's
// prefill; prefill_done then releases it.
func TestPDServeWhole(t *testing.T) {
	st, _ := startPDStack(t, time.Hour, 1<<20)
	ctx := ctxT(t)
	prefillOf := func(w string) int {
		ws := workerStatus(st.replicas[0], w)
		if ws.Load == nil {
			return 0
		}
		return ws.Load.PrefillTokens
	}
	resp, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 2048), PD: true})
	if err != nil || resp.PD != api.PDSplit || resp.Worker != "d-0" {
		t.Fatalf("route: %+v %v, want a split decoding on d-0", resp, err)
	}
	if n := prefillOf("d-0"); n != 0 {
		t.Fatalf("a split's decode worker carries %d prefill tokens, want 0", n)
	}
	if err := st.client.Free(ctx, testModel, resp.PrefillBooking()); err != nil {
		t.Fatal(err)
	}
	if err := st.client.ServeWhole(ctx, testModel, resp); err != nil {
		t.Fatalf("serve_whole: %v", err)
	}
	if n := prefillOf("d-0"); n != 2048 {
		t.Fatalf("after serve_whole d-0 carries %d prefill tokens, want the prompt's 2048", n)
	}
	if err := st.client.PrefillDone(ctx, testModel, resp); err != nil {
		t.Fatal(err)
	}
	if n := prefillOf("d-0"); n != 0 {
		t.Fatalf("after prefill_done d-0 carries %d prefill tokens, want 0", n)
	}
	if err := st.client.Free(ctx, testModel, resp); err != nil {
		t.Fatal(err)
	}
	// Without the booking's fence the call is refused, like every lifecycle call.
	bad := *resp
	bad.Fence = "00000000000000000000000000000000"
	var ae *api.Error
	if err := st.client.ServeWhole(ctx, testModel, &bad); !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
		t.Fatalf("serve_whole with a wrong fence: %v, want not_found", err)
	}
}
