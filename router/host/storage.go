package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/bindings"
	"github.com/kvrouter/kvrouter/internal/jskv"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers"
)

// Limits of the streams and buckets a replica creates (Config.*MaxBytes).
// Each is discarded or refused as docs/protocol.md "Streams and buckets"
// says: the event stream drops its oldest batches (a replica replaying
// from before them resyncs), the buckets refuse new writes.
const (
	// DefaultEventMaxBytes holds the default hour of events for a fleet
	// publishing up to ~290 KiB/s of batches; a busier fleet keeps less
	// than an hour, which is fine while it exceeds two snapshot intervals.
	DefaultEventMaxBytes int64 = 1 << 30
	// DefaultRegistryMaxBytes: a registration is ~0.5 KiB, so 64 MiB is
	// far above any real fleet and still bounds a flood of registrations.
	DefaultRegistryMaxBytes int64 = 64 << 20
	// DefaultBindingsMaxBytes: a binding takes ~350 B in the bucket
	// (300k sessions measured at 104 MB), so 256 MiB holds ~750k live
	// sessions.
	DefaultBindingsMaxBytes int64 = 256 << 20
)

// limitOr is a configured limit: 0 is def, negative is unlimited (0 to
// the stream and bucket configs).
func limitOr(v, def int64) int64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// owner is how this replica treats existing streams and buckets: verify
// them against its configuration, warn per difference, or update them
// with Config.UpdateStreams.
func (r *Replica) owner() jskv.Owner {
	return jskv.Owner{Update: r.cfg.UpdateStreams, Report: func(m jskv.Mismatch) {
		attrs := []any{"kind", m.Kind, "name", m.Name, "field", m.Field, "have", m.Have, "want", m.Want}
		if r.cfg.UpdateStreams {
			r.log.Info("updated "+m.Kind+" configuration to this replica's", attrs...)
			return
		}
		r.log.Warn(m.Kind+" configuration differs from this replica's; left as it is (--update-streams applies it)", attrs...)
	}}
}

// setUpStreams creates the event stream, the worker registry bucket and
// the snapshot object store (when snapshots are on) with this replica's
// replicas and limits, or verifies existing ones (owner). Workers and
// bridges only look them up, so the replica is where their configuration
// is decided. The event stream is set up in approximate mode too: workers
// still publish to it. The bindings bucket is opened by bindings.Open:
// setUpBindings wraps it.
func (r *Replica) setUpStreams(ctx context.Context) error {
	own := r.owner()
	sc := kvevents.StreamConfig{
		Name: r.cfg.EventStream, Prefix: r.cfg.Prefix, MaxAge: r.cfg.EventMaxAge, Replicas: r.cfg.StreamReplicas,
		MaxBytes: limitOr(r.cfg.EventMaxBytes, DefaultEventMaxBytes),
	}
	if _, err := kvevents.SetUpStream(ctx, r.js, sc, own); err != nil {
		return fmt.Errorf("host: event stream %s: %w", r.cfg.EventStream, err)
	}
	if _, err := workers.OwnBucket(ctx, r.js, r.registryConfig(), limitOr(r.cfg.RegistryMaxBytes, DefaultRegistryMaxBytes), own); err != nil {
		return fmt.Errorf("host: worker registry bucket: %w", err)
	}
	if r.cfg.LoadSnapshot || r.cfg.SnapshotInterval > 0 {
		if err := r.setUpSnapshotBucket(ctx, own); err != nil {
			return err
		}
	}
	return nil
}

// registryConfig is the registry configuration of this replica's bucket
// and membership view.
func (r *Replica) registryConfig() workers.RegistryConfig {
	rc := r.cfg.Registry
	rc.Logger = r.log
	if rc.Replicas == 0 {
		rc.Replicas = r.cfg.StreamReplicas
	}
	return rc
}

// setUpSnapshotBucket creates the snapshot object store with
// StreamReplicas (router/index creates a missing one with one replica on
// the first save), or verifies the existing one.
func (r *Replica) setUpSnapshotBucket(ctx context.Context, own jskv.Owner) error {
	name := r.cfg.SnapshotBucket
	lookup := func(c context.Context) (jetstream.ObjectStore, error) { return r.js.ObjectStore(c, name) }
	obs, err := jskv.Call(ctx, lookup)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = jskv.CreateWaitingForPeers(ctx, func(c context.Context) (jetstream.ObjectStore, error) {
			return r.js.CreateObjectStore(c, jetstream.ObjectStoreConfig{
				Bucket: name, Description: "kvrouter prefix-index snapshots", Replicas: r.cfg.StreamReplicas,
			})
		})
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			obs, err = jskv.Call(ctx, lookup) // another replica (or our lost try) created it first
		}
	}
	if err == nil {
		var st jetstream.ObjectStoreStatus
		if st, err = obs.Status(ctx); err == nil {
			if bs, ok := st.(*jetstream.ObjectBucketStatus); ok {
				err = jskv.Reconcile(ctx, r.js, "object store", name, bs.StreamInfo(), jskv.Limits{Replicas: r.cfg.StreamReplicas}, &own)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("host: snapshot bucket %q: %w", name, err)
	}
	return nil
}

// openBindings opens the bindings table (bindings.Open creates a missing
// bucket with cfg's replicas) and then verifies the bucket as the other
// buckets are: a bucket this call created gets this replica's limits
// (until bindings.Config carries them), an existing one is reported or
// updated as owner says.
func (r *Replica) openBindings(ctx context.Context, cfg bindings.Config) (*bindings.Table, error) {
	bucket := cfg.Bucket
	if bucket == "" {
		bucket = bindings.DefaultBucket
	}
	stream := "KV_" + bucket
	_, err := jskv.Call(ctx, func(c context.Context) (jetstream.Stream, error) { return r.js.Stream(c, stream) })
	existed := !errors.Is(err, jetstream.ErrStreamNotFound) // unsure (a timeout): treat it as existing, never update unasked
	if cfg.MaxBytes = limitOr(r.cfg.BindingsMaxBytes, DefaultBindingsMaxBytes); cfg.MaxBytes == 0 {
		cfg.MaxBytes = -1 // unlimited, in bindings.Config's terms
	}
	cfg.KeepLimits = existed && !r.cfg.UpdateStreams
	table, err := bindings.Open(ctx, r.js, r.nc, cfg)
	if err != nil {
		return nil, fmt.Errorf("host: bindings table: %w", err)
	}
	own := r.owner()
	if !existed {
		own = jskv.Owner{Update: true} // ours: apply the limits it was created without
	}
	s, err := r.js.Stream(ctx, stream)
	if err == nil {
		want := jskv.Limits{Replicas: cfg.Replicas, MaxBytes: limitOr(r.cfg.BindingsMaxBytes, DefaultBindingsMaxBytes)}
		err = jskv.Reconcile(ctx, r.js, "bucket", bucket, s.CachedInfo(), want, &own)
	}
	if err != nil {
		_ = table.Close()
		return nil, fmt.Errorf("host: bindings bucket %q: %w", bucket, err)
	}
	return table, nil
}
