package jskv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API error codes this package and its callers act on.
const (
	CodeWrongLastSeq      jetstream.ErrorCode = 10071 // CAS lost
	CodeWrongLastSeqConst jetstream.ErrorCode = 10164 // CAS lost while another write to the subject is in flight (replicated)
	CodeNoMessage         jetstream.ErrorCode = 10037 // MSG.GET: nothing stored under the subject
	CodeNoPeers           jetstream.ErrorCode = 10005 // too few cluster peers for the replicas asked for
)

// ErrBucketConfig: an existing bucket cannot carry per-key TTLs safely.
// The concrete error is a *BucketConfigError.
var ErrBucketConfig = errors.New("jskv: bucket unsuitable for per-key TTL")

// BucketConfigError says why a bucket was refused.
type BucketConfigError struct {
	Bucket    string
	MarkerTTL time.Duration // the bucket's LimitMarkerTTL; <= 0: per-key TTL is off
	History   int64         // revisions kept per key; must be 1
}

func (e *BucketConfigError) Error() string {
	if e.MarkerTTL <= 0 {
		return fmt.Sprintf("bucket %q has no per-key TTL (LimitMarkerTTL unset)", e.Bucket)
	}
	return fmt.Sprintf("bucket %q keeps %d revisions per key (need 1: an expired revision must not resurface an older one)",
		e.Bucket, e.History)
}

// Unwrap returns ErrBucketConfig.
func (e *BucketConfigError) Unwrap() error { return ErrBucketConfig }

// BucketConfig is what EnsureBucket creates when the bucket is missing.
type BucketConfig struct {
	Bucket      string
	Description string
	Replicas    int
	Storage     jetstream.StorageType
	MarkerTTL   time.Duration // LimitMarkerTTL, > 0
	// MaxBytes bounds the bucket's stream (0: unlimited). A KV bucket
	// discards new: once full, writes of new revisions fail with the
	// server's "maximum bytes exceeded" and stored keys stay.
	MaxBytes int64
	// WaitForPeers: when creating fails with code 10005 (a cluster that is
	// still starting has too few peers), retry with backoff until ctx ends
	// instead of failing at once.
	WaitForPeers bool
	// Owner is set by the one process that owns the bucket's configuration
	// (the router replica): an existing bucket whose Replicas or MaxBytes
	// differ from this config is reported, or updated. Without it an
	// existing bucket's configuration is taken as it is.
	Owner *Owner
}

// Owner is how the owner of a bucket or stream treats an existing one
// whose configuration differs from its own.
type Owner struct {
	// Update the existing bucket or stream to the owner's configuration.
	// Otherwise nothing is changed and each difference goes to Report.
	Update bool
	// Report gets each difference (with Update: after the update
	// succeeded, so the caller can log what changed). nil: ignored.
	Report func(Mismatch)
}

func (o *Owner) report(ms []Mismatch) {
	if o == nil || o.Report == nil {
		return
	}
	for _, m := range ms {
		o.Report(m)
	}
}

// Mismatch is one field in which an existing stream or bucket differs
// from its owner's configuration.
type Mismatch struct {
	Kind  string // "stream", "bucket" or "object store"
	Name  string // stream or bucket name
	Field string // "replicas", "max_bytes", "max_age", ...
	Have  string // the existing value
	Want  string // the owner's value
}

func (m Mismatch) String() string {
	return fmt.Sprintf("%s %q: %s is %s, configured %s", m.Kind, m.Name, m.Field, m.Have, m.Want)
}

// Compare returns the differences of named fields of an existing resource
// (have) from its owner's configuration (want), in the order given. Values
// are compared and printed with %v.
func Compare(kind, name string, fields ...Field) []Mismatch {
	var out []Mismatch
	for _, f := range fields {
		if f.Have != f.Want {
			out = append(out, Mismatch{Kind: kind, Name: name, Field: f.Name, Have: fmt.Sprint(f.Have), Want: fmt.Sprint(f.Want)})
		}
	}
	return out
}

// Field is one configuration field to Compare: comparable values.
type Field struct {
	Name       string
	Have, Want any
}

// LimitOf is how a limit is configured (0: unlimited) in the server's
// terms, which store unlimited as -1.
func LimitOf(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// EnsureBucket binds to cfg.Bucket, creating it with History 1 and
// LimitMarkerTTL when it does not exist (another process creating it at
// the same time is fine), then checks that the bucket, new or old, has
// LimitMarkerTTL > 0 and History == 1: without the first per-key TTLs are
// ignored, with more history an expired revision lets an older one
// resurface. A refused bucket is a *BucketConfigError. It never changes
// an existing bucket, except for its owner (cfg.Owner with Update): see
// Owner and Reconcile.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (jetstream.KeyValue, error) {
	// Each API call is bounded and tried again if its reply is lost (Call).
	lookup := func(c context.Context) (jetstream.KeyValue, error) { return js.KeyValue(c, cfg.Bucket) }
	kv, err := Call(ctx, lookup)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		create := func(c context.Context) (jetstream.KeyValue, error) {
			return js.CreateKeyValue(c, jetstream.KeyValueConfig{
				Bucket:         cfg.Bucket,
				Description:    cfg.Description,
				History:        1,
				Replicas:       cfg.Replicas,
				Storage:        cfg.Storage,
				LimitMarkerTTL: cfg.MarkerTTL,
				MaxBytes:       LimitOf(cfg.MaxBytes),
			})
		}
		if cfg.WaitForPeers {
			kv, err = CreateWaitingForPeers(ctx, create)
		} else {
			kv, err = Call(ctx, create)
		}
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = Call(ctx, lookup) // another process (or our lost attempt) created it first
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %q: %w", cfg.Bucket, err)
	}
	status, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("status of bucket %q: %w", cfg.Bucket, err)
	}
	if status.LimitMarkerTTL() <= 0 || status.History() != 1 {
		return nil, &BucketConfigError{Bucket: cfg.Bucket, MarkerTTL: status.LimitMarkerTTL(), History: status.History()}
	}
	if st, ok := status.(*jetstream.KeyValueBucketStatus); ok {
		want := Limits{Replicas: cfg.Replicas, MaxBytes: cfg.MaxBytes}
		if err := Reconcile(ctx, js, "bucket", cfg.Bucket, st.StreamInfo(), want, cfg.Owner); err != nil {
			return nil, err
		}
	}
	return kv, nil
}
