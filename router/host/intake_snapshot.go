package host

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/router/index"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
)

// loadSnapshots restores every model's index from its newest snapshot that
// passes verifySnapshot and returns the stream sequence to replay from: one
// past the oldest snapshot (replaying events a snapshot already holds is
// harmless), or 0 (the whole stream) when any model has none.
func (in *eventIntake) loadSnapshots(ctx context.Context) uint64 {
	st, err := in.js.Stream(ctx, in.cfg.EventStream)
	var info *jetstream.StreamInfo
	if err == nil {
		info, err = st.Info(ctx)
	}
	if err != nil {
		in.log.Warn("index snapshots not loaded: cannot read the event stream to verify them; replaying the whole stream",
			"stream", in.cfg.EventStream, "err", err)
		return 0
	}
	start := uint64(0)
	for i, name := range in.modelList {
		ms := in.models[name]
		t0 := time.Now()
		store := index.SnapshotStore{JS: in.js, Bucket: in.cfg.SnapshotBucket, Verify: in.verifySnapshot(ctx, ms, info.State.LastSeq)}
		seq, err := store.Load(ctx, ms.index)
		switch {
		case errors.Is(err, index.ErrNoSnapshot):
			in.log.Info("no index snapshot: replaying the whole event stream", "model", name)
			in.m.snapshots.Add(ctx, 1, attr(attribute.String("op", "load"), attribute.String("result", "none")))
			return 0
		case err != nil:
			in.log.Warn("index snapshot not loaded: replaying the whole event stream", "model", name, "err", err)
			in.m.snapshots.Add(ctx, 1, attr(attribute.String("op", "load"), attribute.String("result", "error")))
			// A partial restore would double-count nothing (replay is
			// idempotent), but start clean to be sure.
			for _, n := range in.modelList[:i+1] {
				in.models[n].index = index.New(in.cfg.indexConfig(n))
			}
			return 0
		}
		in.m.snapshots.Add(ctx, 1, attr(attribute.String("op", "load"), attribute.String("result", "ok")))
		in.log.Info("index snapshot loaded", "model", name, "stream_seq", seq, "took", time.Since(t0).Round(time.Millisecond))
		if i == 0 || seq+1 < start {
			start = seq + 1
		}
	}
	return start
}

// verifySnapshot checks a snapshot of ms's index against the stream and the
// registry before it is trusted. Anyone who can write the bucket can store
// a well-formed snapshot: one claiming a sequence past the stream's last
// would start the subscriber beyond every event (a replica that says it is
// ready and never sees one), so it is refused, logged and counted
// (kvr.index.snapshots{op="load",result="rejected"}), and the next older
// one is tried. Workers not in the registry are left out, as their events
// would be. A snapshot older than the stream's first sequence is kept: the
// subscriber's cursors turn the missing events into per-worker gaps.
// Implausible cursors are the subscriber's id window's to catch.
func (in *eventIntake) verifySnapshot(ctx context.Context, ms *modelState, lastSeq uint64) func(*index.Snapshot) error {
	return func(s *index.Snapshot) error {
		if s.StreamSeq > lastSeq {
			err := fmt.Errorf("snapshot covers stream sequence %d, past the last sequence %d of stream %s", s.StreamSeq, lastSeq, in.cfg.EventStream)
			ms.snapRejected.Add(1)
			in.m.snapshots.Add(ctx, 1, attr(attribute.String("op", "load"), attribute.String("result", "rejected")))
			in.log.Warn("index snapshot skipped", "model", ms.name, "stream_seq", s.StreamSeq, "err", err)
			return err
		}
		kept := s.Workers[:0]
		for _, w := range s.Workers {
			if ms.registered(w.Key.Worker) {
				kept = append(kept, w)
			}
		}
		if n := len(s.Workers) - len(kept); n > 0 {
			in.log.Info("index snapshot: worker ranks not in the registry left out", "model", ms.name, "stream_seq", s.StreamSeq, "ranks", n)
		}
		s.Workers = kept
		return nil
	}
}

// writeSnapshots writes one snapshot per model now; the replica calls it
// every SnapshotInterval. Any replica may write; the store keeps the
// newest (a stale write is refused by the index package and not an error
// here).
func (in *eventIntake) writeSnapshots() {
	for _, name := range in.modelList {
		ms := in.models[name]
		ctx, cancel := context.WithTimeout(context.Background(), 2*in.cfg.SnapshotInterval+10*time.Second)
		t0 := time.Now()
		seq, err := index.SaveSnapshot(ctx, in.js, in.cfg.SnapshotBucket, ms.index)
		cancel()
		result := "ok"
		switch {
		case errors.Is(err, index.ErrStaleSnapshot):
			result = "stale"
		case err != nil:
			result = "error"
			in.log.Warn("index snapshot not written", "model", name, "err", err)
		default:
			in.log.Debug("index snapshot written", "model", name, "stream_seq", seq, "took", time.Since(t0))
		}
		in.m.snapshots.Add(context.Background(), 1, attr(attribute.String("op", "save"), attribute.String("result", result)))
	}
}
