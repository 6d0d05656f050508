package host

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// Approximate mode: workers publish no events, the replica never touches the
// event stream, and its own routing decisions alone bring a repeated prefix
// back to the worker that served it.
func TestApproximateModeRoutesRepeatedPrefix(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1, mutate: func(_ int, c *Config) { c.Approximate = true }})
	ctx := ctxT(t)
	// A fleet with no emitter: the engines cache, but say nothing.
	f, err := sim.NewFleet(sim.FleetConfig{
		Count: 4, IDPrefix: "quiet",
		Engine:   sim.Config{Model: testModel, KVBlocks: 4096, Speedup: 50},
		Registry: testRegistry(),
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(ctx, st.nc, st.js); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.Stop(cctx)
	})
	st.waitWorkers(4)

	r := st.replicas[0]
	ms := r.models[testModel]
	if !ms.approx || ms.pred.Config().TTL != index.DefaultApproxTTL {
		t.Fatalf("approximate index not in use: approx %v ttl %v", ms.approx, ms.pred.Config().TTL)
	}
	// The replica owns the event stream in every mode (workers still
	// publish to it), but approximate mode does not read it.
	if es, err := st.js.Stream(ctx, kvevents.DefaultStream); err != nil || es.CachedInfo().State.Consumers != 0 {
		t.Fatalf("event stream lookup: %v; want the stream, with no consumer (approximate mode does not read it)", err)
	}

	prefix := tokens(7, 512)
	first, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: prefix, ExpectedOutputTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	if first.OverlapBlocks != 0 {
		t.Fatalf("first route overlap %d, want 0", first.OverlapBlocks)
	}
	st.generate(ctx, first, prefix)
	hashes := kvevents.SeqHashes(nil, prefix, DefaultBlockSize, kvevents.HashSeed)
	testutil.Eventually(t, 5*time.Second, func() bool {
		var ov index.Overlaps
		ms.pred.Lookup(hashes, index.LookupOptions{}, &ov)
		return ov.Total == len(hashes)
	}, func() string { return "decision not recorded in the approximate index" })
	st.waitWorker(first.Worker, idle)

	for i := 0; i < 5; i++ {
		req := &api.RouteRequest{Model: testModel, TokenIDs: append(append([]uint32(nil), prefix...), tokens(300+i, 64)...), ExpectedOutputTokens: 4}
		got, err := st.client.Route(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if got.Worker != first.Worker || got.OverlapBlocks < 32 {
			t.Fatalf("request %d went to %s with overlap %d/%d, want %s with >= 32", i, got.Worker, got.OverlapBlocks, got.PromptBlocks, first.Worker)
		}
		if err := st.client.Free(ctx, testModel, got); err != nil {
			t.Fatal(err)
		}
		st.waitWorker(first.Worker, idle)
	}
}

func TestApproximateConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"snapshot load", Config{Models: []string{"m"}, Approximate: true, LoadSnapshot: true}},
		{"snapshot interval", Config{Models: []string{"m"}, Approximate: true, SnapshotInterval: time.Second}},
		{"negative ttl", Config{Models: []string{"m"}, Approximate: true, ApproxTTL: -time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.normalize(); !errors.Is(err, ErrConfig) {
				t.Fatalf("normalize: %v, want ErrConfig", err)
			}
		})
	}
}
