package host

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workerref"
)

// Booking sync is encoding/json both ways: what a replica publishes is what
// its peers read, event by event.
func TestBookingBatchRoundTrip(t *testing.T) {
	in := bookingBatch{V: 1, Replica: "r\"1", Events: []scheduler.BookingEvent{
		{Replica: "r\"1", Seq: 4, Kind: scheduler.BookingAdd, RequestID: "q<1>", Worker: "w", Rank: 2, Attempt: 9,
			PrefillTokens: 100, Blocks: 7, At: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)},
		{Replica: "r", Seq: 5, Kind: scheduler.BookingFree, RequestID: "q", Worker: "w", At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))},
	}}
	data, err := json.Marshal(&in)
	if err != nil {
		t.Fatal(err)
	}
	var out bookingBatch
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if out.V != in.V || out.Replica != in.Replica || len(out.Events) != len(in.Events) {
		t.Fatalf("decoded %+v, want %+v", out, in)
	}
	for i := range in.Events {
		a, b := in.Events[i], out.Events[i]
		if !a.At.Equal(b.At) {
			t.Fatalf("event %d at %v, want %v", i, b.At, a.At)
		}
		a.At, b.At = time.Time{}, time.Time{}
		if a != b {
			t.Fatalf("event %d: %+v, want %+v", i, b, a)
		}
	}
}

// The hand-written encoder writes exactly what json.Marshal writes.
func TestBookingBatchEncoding(t *testing.T) {
	want, err := json.Marshal(&benchBookings)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendBookingBatch(nil, &benchBookings); string(got) != string(want) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

var benchBookings = bookingBatch{V: 1, Replica: "r\"1", Events: []scheduler.BookingEvent{
	{Replica: "r\"1", Seq: 4, Kind: scheduler.BookingAdd, RequestID: "q<1>", Worker: "w", Rank: 2, Attempt: 9,
		PrefillTokens: 100, Blocks: 7, At: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)},
	{Replica: "r", Seq: 5, Kind: scheduler.BookingFree, RequestID: "q", Worker: "w", At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))},
}}

// Booking sync encodes every booking change (two per routed request): the
// hand-written encoder stays while it beats encoding/json here.
func BenchmarkBookingBatchEncode(b *testing.B) {
	b.ReportAllocs()
	var buf []byte
	for i := 0; i < b.N; i++ {
		buf = appendBookingBatch(buf[:0], &benchBookings)
	}
}

func BenchmarkBookingBatchEncodingJSON(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := json.Marshal(&benchBookings); err != nil {
			b.Fatal(err)
		}
	}
}

// Two replicas: a decision routed through replica A reaches replica B's
// predicted index, so B's lookup sees the overlap before any event and B
// routes the prefix to the same worker.
func TestDecisionsSharedBetweenReplicas(t *testing.T) {
	st := startStack(t, stackOpts{workers: 4, replicas: 2})
	st.waitWorkers(4)
	ctx := ctxT(t)
	a, b := st.replicas[0], st.replicas[1]

	prefix := tokens(42, 512)
	var first api.RouteResponse
	if err := a.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: prefix, ExpectedOutputTokens: 4}, &first); err != nil {
		t.Fatal(err)
	}
	// Nothing ran on the worker, so no Stored event exists: only the
	// shared decision can tell B.
	hashes := kvevents.SeqHashes(nil, prefix, DefaultBlockSize, kvevents.HashSeed)
	want := workerref.Target{Worker: first.Worker, Rank: first.Rank}
	bm := b.models[testModel]
	testutil.Eventually(t, 5*time.Second, func() bool {
		var ov index.Overlaps
		bm.pred.Lookup(hashes, index.LookupOptions{}, &ov)
		return len(ov.Workers) == 1 && ov.Workers[0].Key == want && ov.Workers[0].Blocks == len(hashes)
	}, func() string { return "replica B's predicted index does not hold A's decision" })
	if bm.peers.decApplied.Load() == 0 || a.models[testModel].peers.decApplied.Load() != 0 {
		t.Fatalf("applied: B %d (want > 0), A %d (want 0: own echo)", bm.peers.decApplied.Load(), a.models[testModel].peers.decApplied.Load())
	}
	if err := st.client.Free(ctx, testModel, &first); err != nil {
		t.Fatal(err)
	}
	st.waitWorker(first.Worker, idle)

	var got api.RouteResponse
	req := &api.RouteRequest{Model: testModel, TokenIDs: append(append([]uint32(nil), prefix...), tokens(43, 64)...), ExpectedOutputTokens: 4}
	if err := b.Route(ctx, req, &got); err != nil {
		t.Fatal(err)
	}
	if got.Worker != first.Worker || got.OverlapBlocks != 32 {
		t.Fatalf("B routed to %s with overlap %d, want %s with 32", got.Worker, got.OverlapBlocks, first.Worker)
	}
	if err := st.client.Free(ctx, testModel, &got); err != nil {
		t.Fatal(err)
	}
}
