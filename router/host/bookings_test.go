package host

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/router/scheduler"
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
