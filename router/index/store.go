package index

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultSnapshotBucket is the object-store bucket snapshots go to.
const DefaultSnapshotBucket = "kvr-index-snapshots"

// Object metadata keys written with every snapshot.
const (
	MetaStreamSeq = "kvr-stream-seq"
	MetaFormat    = "kvr-format"
	MetaModel     = "kvr-model"
	MetaWorkers   = "kvr-workers"
	MetaEntries   = "kvr-entries"
)

// SnapshotStore keeps index snapshots in a JetStream object store.
//
// Each snapshot is its own object, named SnapshotObjectName(model, seq):
// "index.<model>." followed by the stream sequence as 20 zero-padded
// digits. An object is never overwritten, so no replica can replace a
// newer snapshot with an older one, whatever the interleaving: the object
// store has no compare-and-set on a name, and a check-then-overwrite of a
// single name would let a slow writer clobber a newer snapshot. Save
// refuses (ErrStaleSnapshot) when a snapshot at the same or a newer
// sequence is already stored, and then deletes all but the newest Keep
// versions; a version is only ever deleted by a replica that sees Keep
// newer ones, so the newest always survives. Load takes the newest
// readable version.
type SnapshotStore struct {
	JS       jetstream.JetStream
	Bucket   string // default DefaultSnapshotBucket
	Keep     int    // versions kept per model, default 2 (a reader may still be fetching the previous one)
	Replicas int    // replicas when Save creates the bucket (default 1); an existing bucket is used as is
	// Verify, when set, checks each decoded snapshot before Load restores
	// it, against what the caller knows (the stream's last sequence, the
	// registered workers): an error skips that version for the next older
	// one, and Verify may drop workers from s.Workers. Anyone who can write
	// the bucket can store a well-formed snapshot, so checksums alone
	// cannot make one trustworthy.
	Verify func(s *Snapshot) error
}

// SaveSnapshot writes x's snapshot to bucket (DefaultSnapshotBucket when
// empty) and returns the stream sequence it covers.
func SaveSnapshot(ctx context.Context, js jetstream.JetStream, bucket string, x *Index) (uint64, error) {
	return SnapshotStore{JS: js, Bucket: bucket}.Save(ctx, x)
}

// LoadSnapshot restores the newest snapshot of x's model from bucket into
// x (which must be empty) and returns its stream sequence: replay the
// event stream from the next one. ErrNoSnapshot when there is none.
func LoadSnapshot(ctx context.Context, js jetstream.JetStream, bucket string, x *Index) (uint64, error) {
	return SnapshotStore{JS: js, Bucket: bucket}.Load(ctx, x)
}

// SnapshotObjectName is the object holding model's snapshot at seq.
func SnapshotObjectName(model string, seq uint64) string {
	return fmt.Sprintf("index.%s.%020d", model, seq)
}

// parseSnapshotName returns the sequence of an object of model's, or false.
func parseSnapshotName(model, name string) (uint64, bool) {
	prefix := "index." + model + "."
	if len(name) != len(prefix)+20 || name[:len(prefix)] != prefix {
		return 0, false
	}
	seq, err := strconv.ParseUint(name[len(prefix):], 10, 64)
	return seq, err == nil
}

func (s SnapshotStore) bucket() string {
	if s.Bucket == "" {
		return DefaultSnapshotBucket
	}
	return s.Bucket
}

func (s SnapshotStore) keep() int {
	if s.Keep <= 0 {
		return 2
	}
	return s.Keep
}

func (s SnapshotStore) open(ctx context.Context, create bool) (jetstream.ObjectStore, error) {
	obs, err := s.JS.ObjectStore(ctx, s.bucket())
	if err == nil || !errors.Is(err, jetstream.ErrBucketNotFound) || !create {
		if err != nil {
			return nil, fmt.Errorf("index: open snapshot bucket %q: %w", s.bucket(), err)
		}
		return obs, nil
	}
	obs, err = s.JS.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      s.bucket(),
		Description: "kvrouter prefix-index snapshots",
		Replicas:    max(1, s.Replicas),
	})
	if err != nil {
		// Another replica may have created it meanwhile.
		if obs2, err2 := s.JS.ObjectStore(ctx, s.bucket()); err2 == nil {
			return obs2, nil
		}
		return nil, fmt.Errorf("index: create snapshot bucket %q: %w", s.bucket(), err)
	}
	return obs, nil
}

type version struct {
	seq  uint64
	name string
}

// versions lists model's snapshots, newest first.
func versions(ctx context.Context, obs jetstream.ObjectStore, model string) ([]version, error) {
	infos, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("index: list snapshots: %w", err)
	}
	var vs []version
	for _, in := range infos {
		if seq, ok := parseSnapshotName(model, in.Name); ok && !in.Deleted {
			vs = append(vs, version{seq, in.Name})
		}
	}
	slices.SortFunc(vs, func(a, b version) int {
		switch {
		case a.seq > b.seq:
			return -1
		case a.seq < b.seq:
			return 1
		}
		return 0
	})
	return vs, nil
}

// Newest returns the newest stored sequence for model (0, false if none).
func (s SnapshotStore) Newest(ctx context.Context, model string) (uint64, bool, error) {
	obs, err := s.open(ctx, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	vs, err := versions(ctx, obs, model)
	if err != nil || len(vs) == 0 {
		return 0, false, err
	}
	return vs[0].seq, true, nil
}

// Save snapshots x and stores it unless a snapshot at the same or a newer
// stream sequence exists (ErrStaleSnapshot, nothing written). It returns
// the stream sequence the snapshot covers.
func (s SnapshotStore) Save(ctx context.Context, x *Index) (uint64, error) {
	model := x.cfg.Model
	if model == "" {
		return 0, ErrNoModel
	}
	obs, err := s.open(ctx, true)
	if err != nil {
		return 0, err
	}
	// Cheap pre-check before encoding: the stream sequence only grows.
	vs, err := versions(ctx, obs, model)
	if err != nil {
		return 0, err
	}
	if cur := x.StreamSeq(); len(vs) > 0 && vs[0].seq >= cur {
		return 0, fmt.Errorf("%w: stored %d, this index %d", ErrStaleSnapshot, vs[0].seq, cur)
	}
	snap := x.Snapshot()
	data, err := snap.MarshalBinary()
	if err != nil {
		return 0, err
	}
	if vs, err = versions(ctx, obs, model); err != nil {
		return 0, err
	}
	if len(vs) > 0 && vs[0].seq >= snap.StreamSeq {
		return 0, fmt.Errorf("%w: stored %d, this snapshot %d", ErrStaleSnapshot, vs[0].seq, snap.StreamSeq)
	}
	name := SnapshotObjectName(model, snap.StreamSeq)
	_, err = obs.Put(ctx, jetstream.ObjectMeta{
		Name:        name,
		Description: "kvrouter index snapshot",
		Metadata: map[string]string{
			MetaStreamSeq: strconv.FormatUint(snap.StreamSeq, 10),
			MetaFormat:    strconv.Itoa(snapshotVersion),
			MetaModel:     model,
			MetaWorkers:   strconv.Itoa(len(snap.Workers)),
			MetaEntries:   strconv.Itoa(snap.Entries()),
		},
	}, bytes.NewReader(data))
	if err != nil {
		return 0, fmt.Errorf("index: put snapshot %q: %w", name, err)
	}
	s.prune(ctx, obs, model)
	return snap.StreamSeq, nil
}

// prune deletes versions beyond the newest Keep. Errors are ignored: a
// leftover old version only costs space and the next Save retries.
func (s SnapshotStore) prune(ctx context.Context, obs jetstream.ObjectStore, model string) {
	vs, err := versions(ctx, obs, model)
	if err != nil {
		return
	}
	for _, v := range vs[min(len(vs), s.keep()):] {
		_ = obs.Delete(ctx, v.name)
	}
}

// Load restores the newest readable snapshot of x's model into x (which
// must be empty) and returns its stream sequence. A version deleted,
// unreadable or refused by Verify while loading is skipped for the next
// older one.
func (s SnapshotStore) Load(ctx context.Context, x *Index) (uint64, error) {
	model := x.cfg.Model
	if model == "" {
		return 0, ErrNoModel
	}
	obs, err := s.open(ctx, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, fmt.Errorf("%w: bucket %q does not exist", ErrNoSnapshot, s.bucket())
	}
	if err != nil {
		return 0, err
	}
	vs, err := versions(ctx, obs, model)
	if err != nil {
		return 0, err
	}
	if len(vs) == 0 {
		return 0, fmt.Errorf("%w: for model %q in bucket %q", ErrNoSnapshot, model, s.bucket())
	}
	var errs []error
	for _, v := range vs {
		data, err := obs.GetBytes(ctx, v.name)
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			errs = append(errs, fmt.Errorf("index: get snapshot %q: %w", v.name, err))
			continue
		}
		snap, err := DecodeSnapshot(data)
		if err == nil && snap.StreamSeq != v.seq {
			err = corrupt("object %q holds stream sequence %d", v.name, snap.StreamSeq)
		}
		if err == nil && s.Verify != nil {
			if err = s.Verify(snap); err != nil {
				err = fmt.Errorf("%w: %w", ErrSnapshotRejected, err)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("snapshot %q: %w", v.name, err))
			continue
		}
		if err := x.Restore(snap); err != nil {
			return 0, err
		}
		return snap.StreamSeq, nil
	}
	return 0, errors.Join(errs...)
}
