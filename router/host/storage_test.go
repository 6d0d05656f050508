package host

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
)

// A replica verifies an existing event stream against its configuration:
// a difference is a warning naming stream, field, have and want, and the
// stream is left as it is; with UpdateStreams it is updated. Buckets it
// creates get its limits.
func TestReplicaVerifiesStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and replicas")
	}
	srv := natstest.Start(t)
	_, js := natstest.JetStream(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kvevents.EnsureStream(ctx, js, kvevents.StreamConfig{MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	maxBytes := func(stream string) int64 {
		t.Helper()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.MaxBytes
	}
	start := func(update bool) string {
		t.Helper()
		var logs testutil.LogBuffer
		r, err := New(natstest.Connect(t, srv), Config{Models: []string{testModel}, Registry: testRegistry(), UpdateStreams: update,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close(context.Background())
		if err := r.Start(ctx); err != nil {
			t.Fatalf("start: %v", err)
		}
		return logs.String()
	}

	logs := start(false)
	if !strings.Contains(logs, `level=WARN msg="stream configuration differs from this replica's; left as it is (--update-streams applies it)" replica=`) ||
		!strings.Contains(logs, "kind=stream name=KVR_EVENTS field=max_bytes have=1048576 want=1073741824") {
		t.Fatalf("no warning about the stream's max bytes in:\n%s", logs)
	}
	if got := maxBytes(kvevents.DefaultStream); got != 1<<20 {
		t.Fatalf("verifying changed the stream's max bytes to %d", got)
	}
	for stream, want := range map[string]int64{"KV_kvr-workers": DefaultRegistryMaxBytes, "KV_kvr-bindings": DefaultBindingsMaxBytes} {
		if got := maxBytes(stream); got != want {
			t.Errorf("%s created with max bytes %d, want %d", stream, got, want)
		}
	}

	logs = start(true)
	if strings.Contains(logs, "left as it is") || !strings.Contains(logs, `level=INFO msg="updated stream configuration to this replica's"`) {
		t.Fatalf("with UpdateStreams: want an info line for the update and no warning:\n%s", logs)
	}
	if got := maxBytes(kvevents.DefaultStream); got != DefaultEventMaxBytes {
		t.Fatalf("after the update: max bytes %d, want %d", got, DefaultEventMaxBytes)
	}
}
