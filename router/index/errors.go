package index

import "errors"

var (
	// ErrSnapshotCorrupt means snapshot bytes failed a bounds, count or
	// checksum check. Wrapped errors name the offending field.
	ErrSnapshotCorrupt = errors.New("index: corrupt snapshot")
	// ErrSnapshotVersion means the snapshot was written by an unknown
	// format version.
	ErrSnapshotVersion = errors.New("index: unsupported snapshot version")
	// ErrSnapshotMismatch means a snapshot for another model or tier was
	// offered.
	ErrSnapshotMismatch = errors.New("index: snapshot is for another model or tier")
	// ErrSnapshotRejected means SnapshotStore.Verify refused a snapshot
	// (it is ahead of the event stream, say).
	ErrSnapshotRejected = errors.New("index: snapshot rejected")
	// ErrNoSnapshot means the bucket holds no snapshot for the model.
	ErrNoSnapshot = errors.New("index: no snapshot")
	// ErrStaleSnapshot means a snapshot at the same or a newer stream
	// sequence is already stored, so this one was not written.
	ErrStaleSnapshot = errors.New("index: a newer snapshot is already stored")
	// ErrNoModel means an operation needing Config.Model was called on an
	// index without one.
	ErrNoModel = errors.New("index: config has no model")
	// ErrNotEmpty means a restore was attempted into an index that already
	// holds workers.
	ErrNotEmpty = errors.New("index: index is not empty")
)
