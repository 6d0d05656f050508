package jskv

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/natstest"
)

// The owner of a bucket verifies an existing one: a difference is
// reported and nothing changes, or with Update the limits change; a
// process that is not the owner neither verifies nor changes.
func TestEnsureBucketOwner(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	maxBytes := func() int64 {
		t.Helper()
		st, err := js.Stream(ctx, "KV_owned")
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config.MaxBytes
	}
	base := BucketConfig{Bucket: "owned", MarkerTTL: time.Second, MaxBytes: 1 << 20}
	if _, err := EnsureBucket(ctx, js, base); err != nil {
		t.Fatal(err)
	}
	if got := maxBytes(); got != 1<<20 {
		t.Fatalf("created with max bytes %d, want %d", got, 1<<20)
	}

	var got []Mismatch
	report := func(m Mismatch) { got = append(got, m) }
	want := []Mismatch{{Kind: "bucket", Name: "owned", Field: "max_bytes", Have: "1048576", Want: "2097152"}}
	tests := []struct {
		name      string
		cfg       BucketConfig
		reports   []Mismatch
		wantBytes int64
	}{
		{"not the owner: taken as it is", BucketConfig{Bucket: "owned", MarkerTTL: time.Second, MaxBytes: 2 << 20}, nil, 1 << 20},
		{"same configuration", BucketConfig{Bucket: "owned", MarkerTTL: time.Second, MaxBytes: 1 << 20, Owner: &Owner{Report: report}}, nil, 1 << 20},
		{"owner: reported, unchanged", BucketConfig{Bucket: "owned", MarkerTTL: time.Second, MaxBytes: 2 << 20, Owner: &Owner{Report: report}}, want, 1 << 20},
		{"owner with Update: changed", BucketConfig{Bucket: "owned", MarkerTTL: time.Second, MaxBytes: 2 << 20, Owner: &Owner{Update: true, Report: report}}, want, 2 << 20},
		{"updated owner: nothing left", BucketConfig{Bucket: "owned", MarkerTTL: time.Second, MaxBytes: 2 << 20, Owner: &Owner{Report: report}}, nil, 2 << 20},
	}
	for _, tc := range tests {
		got = nil
		if _, err := EnsureBucket(ctx, js, tc.cfg); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(got, tc.reports) {
			t.Errorf("%s: reported %v, want %v", tc.name, got, tc.reports)
		}
		if b := maxBytes(); b != tc.wantBytes {
			t.Errorf("%s: max bytes %d, want %d", tc.name, b, tc.wantBytes)
		}
	}
	if s := want[0].String(); s != `bucket "owned": max_bytes is 1048576, configured 2097152` {
		t.Errorf("Mismatch text %q", s)
	}
}

// WaitBucket waits for a bucket another process creates, never creates
// one, and gives up when ctx ends.
func TestWaitBucket(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := WaitBucket(short, js, "later"); !errors.Is(err, jetstream.ErrBucketNotFound) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitBucket of a missing bucket: %v, want bucket not found after the deadline", err)
	}
	if _, err := js.KeyValue(context.Background(), "later"); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("WaitBucket created the bucket (err %v)", err)
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	type result struct {
		kv  jetstream.KeyValue
		err error
	}
	found := make(chan result, 1)
	go func() { // the user starts first, the owner creates the bucket later
		kv, err := WaitBucket(ctx, js, "later")
		found <- result{kv, err}
	}()
	if _, err := EnsureBucket(ctx, js, BucketConfig{Bucket: "later", MarkerTTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if r := <-found; r.err != nil || r.kv.Bucket() != "later" {
		t.Fatalf("WaitBucket = %v, %v", r.kv, r.err)
	}
}
