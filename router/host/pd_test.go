package host

import (
	"fmt"
	"testing"

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
