package kvevents

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/jskv"
	"github.com/kvrouter/kvrouter/internal/natstest"
)

// SetUpStream creates a missing stream and otherwise verifies it: what
// differs is reported and left as it is, or updated with Update. Nothing
// but the limits ever changes.
func TestSetUpStream(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []string
	own := jskv.Owner{Report: func(m jskv.Mismatch) { got = append(got, m.String()) }}
	cfg := StreamConfig{MaxAge: time.Hour, MaxBytes: 1 << 20}
	if _, err := SetUpStream(ctx, js, cfg, own); err != nil {
		t.Fatal(err)
	}
	info := func() jetstream.StreamConfig {
		t.Helper()
		st, err := js.Stream(ctx, DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config
	}
	if c := info(); c.MaxBytes != 1<<20 || c.MaxAge != time.Hour || c.Replicas != 1 {
		t.Fatalf("created %+v", c)
	}
	if len(got) != 0 {
		t.Fatalf("a stream just created reported %q", got)
	}

	other := StreamConfig{MaxAge: 2 * time.Hour, MaxBytes: 2 << 20, Prefix: "other"}
	if _, err := SetUpStream(ctx, js, other, own); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`stream "KVR_EVENTS": subjects is kvr.events.>, configured other.events.>`,
		`stream "KVR_EVENTS": max_bytes is 1048576, configured 2097152`,
		`stream "KVR_EVENTS": max_age is 1h0m0s, configured 2h0m0s`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("reported\n%q\nwant\n%q", got, want)
	}
	if c := info(); c.MaxBytes != 1<<20 || c.MaxAge != time.Hour {
		t.Fatalf("verification changed the stream: %+v", c)
	}

	got = nil
	own.Update = true
	if _, err := SetUpStream(ctx, js, other, own); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("update reported %q, want %q", got, want)
	}
	if c := info(); c.MaxBytes != 2<<20 || c.MaxAge != 2*time.Hour || !slices.Equal(c.Subjects, []string{"kvr.events.>"}) {
		t.Fatalf("after the update: max bytes %d, max age %v, subjects %v; want the new limits and the old subjects", c.MaxBytes, c.MaxAge, c.Subjects)
	}
}

// LookupStream finds an existing stream, waits for a missing one and
// never creates it: a stream that does not appear is ErrStreamMissing,
// with the hint at who creates it.
func TestLookupStream(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := LookupStream(short, js, "")
	if !errors.Is(err, ErrStreamMissing) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LookupStream of a missing stream: %v, want ErrStreamMissing after the deadline", err)
	}
	if want := "event stream KVR_EVENTS not found: start kvrouter serve first"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q lacks %q", err, want)
	}
	if _, err := js.Stream(context.Background(), DefaultStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("LookupStream created the stream (err %v)", err)
	}

	ctx, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	type result struct {
		st  jetstream.Stream
		err error
	}
	found := make(chan result, 1)
	go func() { // the worker side starts first
		st, err := LookupStream(ctx, js, DefaultStream)
		found <- result{st, err}
	}()
	if _, err := SetUpStream(ctx, js, StreamConfig{Replicas: 1}, jskv.Owner{}); err != nil {
		t.Fatal(err)
	}
	if r := <-found; r.err != nil || r.st.CachedInfo().Config.Name != DefaultStream {
		t.Fatalf("LookupStream = %v", r.err)
	}
}
