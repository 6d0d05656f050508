package bindings

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// applyLimits sets the bucket stream's MaxMsgs and MaxBytes to
// cfg.MaxSessions (plus one: the quorum key, quorum.go) and cfg.MaxBytes
// (negative: unbounded, -1 on the server) when they differ, and returns
// the stream's replicas. KV streams discard new messages at a limit,
// so the server refuses a create past it (code 10077, ErrFull) while
// renewals of stored keys still pass (History 1: they replace their key's
// message).
//
// It belongs in internal/jskv.EnsureBucket once its BucketConfig carries
// MaxMsgs and MaxBytes; until then the bindings table sets them itself.
func applyLimits(ctx context.Context, js jetstream.JetStream, cfg *Config) (replicas int, err error) {
	stream, err := js.Stream(ctx, "KV_"+cfg.Bucket)
	if err != nil {
		return 0, fmt.Errorf("bindings: stream of bucket %q: %w", cfg.Bucket, err)
	}
	sc := stream.CachedInfo().Config
	if cfg.KeepLimits && (sc.MaxMsgs != -1 || sc.MaxBytes != -1 || sc.Discard == jetstream.DiscardNew) {
		return sc.Replicas, nil // an existing bucket that has limits: its owner's to change
	}
	msgs, bytes := max(cfg.MaxSessions, -1), max(cfg.MaxBytes, -1)
	if msgs > 0 {
		msgs++ // the quorum key's one message
	}
	if sc.MaxMsgs == msgs && sc.MaxBytes == bytes && sc.Discard == jetstream.DiscardNew {
		return sc.Replicas, nil
	}
	sc.MaxMsgs, sc.MaxBytes, sc.Discard = msgs, bytes, jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return 0, fmt.Errorf("bindings: set limits of bucket %q (max sessions %d, max bytes %d): %w", cfg.Bucket, msgs, bytes, err)
	}
	return sc.Replicas, nil
}
