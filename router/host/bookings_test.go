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
