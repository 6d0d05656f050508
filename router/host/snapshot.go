package host

import (
	"context"
	"errors"
	"time"

	"github.com/kvrouter/kvrouter/router/index"
	"go.opentelemetry.io/otel/attribute"
)

// loadSnapshots restores every model's index from its newest snapshot and
// returns the stream sequence to replay from: one past the oldest snapshot
// (replaying events a snapshot already holds is harmless), or 0 (the whole
// stream) when any model has none.
func (r *Replica) loadSnapshots(ctx context.Context) uint64 {
	start := uint64(0)
	for i, name := range r.modelList {
		ms := r.models[name]
		t0 := time.Now()
		seq, err := index.LoadSnapshot(ctx, r.js, r.cfg.SnapshotBucket, ms.index)
		switch {
		case errors.Is(err, index.ErrNoSnapshot):
			r.log.Info("no index snapshot: replaying the whole event stream", "model", name)
			r.m.snapshots.Add(ctx, 1, attr(attribute.String("op", "load"), attribute.String("result", "none")))
			return 0
		case err != nil:
			r.log.Warn("index snapshot not loaded: replaying the whole event stream", "model", name, "err", err)
			r.m.snapshots.Add(ctx, 1, attr(attribute.String("op", "load"), attribute.String("result", "error")))
			// A partial restore would double-count nothing (replay is
			// idempotent), but start clean to be sure.
			for _, n := range r.modelList[:i+1] {
				r.models[n].index = index.New(index.Config{Model: n})
			}
			return 0
		}
		r.m.snapshots.Add(ctx, 1, attr(attribute.String("op", "load"), attribute.String("result", "ok")))
		r.log.Info("index snapshot loaded", "model", name, "stream_seq", seq, "took", time.Since(t0).Round(time.Millisecond))
		if i == 0 || seq+1 < start {
			start = seq + 1
		}
	}
	return start
}

// snapshotLoop writes every model's index snapshot every SnapshotInterval.
// Any replica may write; the store keeps the newest (a stale write is
// refused by the index package and not an error here).
func (r *Replica) snapshotLoop() {
	defer r.bg.Done()
	t := time.NewTicker(r.cfg.SnapshotInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.writeSnapshots()
	}
}

// writeSnapshots writes one snapshot per model now.
func (r *Replica) writeSnapshots() {
	for _, name := range r.modelList {
		ms := r.models[name]
		ctx, cancel := context.WithTimeout(context.Background(), 2*r.cfg.SnapshotInterval+10*time.Second)
		t0 := time.Now()
		seq, err := index.SaveSnapshot(ctx, r.js, r.cfg.SnapshotBucket, ms.index)
		cancel()
		result := "ok"
		switch {
		case errors.Is(err, index.ErrStaleSnapshot):
			result = "stale"
		case err != nil:
			result = "error"
			r.log.Warn("index snapshot not written", "model", name, "err", err)
		default:
			r.log.Debug("index snapshot written", "model", name, "stream_seq", seq, "took", time.Since(t0))
		}
		r.m.snapshots.Add(context.Background(), 1, attr(attribute.String("op", "save"), attribute.String("result", result)))
	}
}
