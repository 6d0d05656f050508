package kvevents

import (
	"strconv"

	"github.com/kvrouter/kvrouter/workerref"
)

// SeqHash is a router-side sequence hash: the XXH3 chain over a block and
// every block before it, so one value names a whole prefix.
type SeqHash uint64

// EngineHash is the engine's own opaque block id. The router never derives
// anything from it; it only links parents and resolves removals per worker.
type EngineHash uint64

// Tier is the storage medium that holds a block.
type Tier uint8

const (
	TierDevice   Tier = iota // GPU memory; the only tier the prefix index scores by default
	TierHost                 // CPU (pinned) memory
	TierDisk                 // local disk
	TierExternal             // remote or shared storage
)

var tierNames = [...]string{"device", "host", "disk", "external"}

func (t Tier) String() string {
	if int(t) < len(tierNames) {
		return tierNames[t]
	}
	return "tier(" + strconv.Itoa(int(t)) + ")"
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	KindStored  EventKind = iota + 1 // blocks entered the cache
	KindRemoved                      // blocks left the cache
	KindCleared                      // every block of the worker's rank left the cache
)

func (k EventKind) String() string {
	switch k {
	case KindStored:
		return "stored"
	case KindRemoved:
		return "removed"
	case KindCleared:
		return "cleared"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// StoredBlock is one full block that entered a worker's cache.
type StoredBlock struct {
	Engine EngineHash // the engine's id, used by later parents and removals
	Seq    SeqHash    // the router-side sequence hash of the prefix ending here
}

// Event is one cache change on one (worker, rank). Only the fields of its
// Kind are meaningful.
type Event struct {
	Kind EventKind
	Tier Tier

	// Stored: the engine hash of the block before Blocks[0], when there is one.
	Parent    EngineHash
	HasParent bool
	Blocks    []StoredBlock

	// Removed: engine hashes of the blocks that left (an engine-keyed batch).
	Removed []EngineHash
	// RemovedSeqs: sequence hashes of the blocks that left (a SeqKeyed batch).
	RemovedSeqs []SeqHash
}

// Batch is what one publisher sends in one message: consecutive events of
// one (worker, rank), numbered from FirstEventID with no holes.
type Batch struct {
	Model        string
	Worker       string
	Rank         uint32
	Epoch        uint64 // random at each worker process start; a change means an empty cache
	FirstEventID uint64 // ids are per (worker, rank), start at 1, consecutive
	Events       []Event

	// SeqKeyed says the publisher names blocks by sequence hash alone: its
	// Stored events carry no engine hashes (StoredBlock.Engine is 0, no
	// Parent) and its removals are RemovedSeqs. The publisher keeps the
	// engine → sequence map itself and counts each (sequence hash, tier)'s
	// engine blocks, so a Stored names a block new to its tier and a
	// Removed one the tier no longer holds. A router then needs no map per
	// worker (the cost of applying an engine-keyed batch; docs/protocol.md,
	// "Sequence-keyed batches"). Encoded as wire version 2.
	SeqKeyed bool
}

// Key returns the (worker, rank) the batch belongs to.
func (b *Batch) Key() workerref.Target { return workerref.Target{Worker: b.Worker, Rank: b.Rank} }
