// Package index is a router replica's prefix index: for every (worker,
// rank), which KV blocks its cache holds, and for a request, how many
// leading blocks of its prompt each worker already has.
//
// It owns:
//
//   - The event-fed index (Index, index.go): applies kvevents Stored,
//     Removed and Cleared events per (worker, rank) as a kvevents.Sink
//     (ApplyBatch, Resync) and a kvevents.CursorSource; ClearWorker,
//     RemoveWorker and LoadWorker (bulk load) for lifecycle and resync.
//     Blocks are keyed by sequence hash (which names the whole prefix).
//     An engine-keyed worker's Removed events name engine hashes, resolved
//     through its engine → sequence map (engmap.go); a sequence-keyed
//     worker's (kvevents.Batch.SeqKeyed, seqkeyed.go) name sequence hashes
//     and need no map, which halves the cost of a block at 1M entries, at
//     the price of a table walk to clear or dump such a worker. A worker
//     whose batches change keying is cleared first. Only Config.Tier
//     (default device) is indexed. Duplicate stores and unknown removals
//     are counted and harmless, which makes replaying events idempotent.
//   - Lookup (lookup.go): per worker, the number of contiguous leading
//     blocks held, plus the longest; stops when no candidate is left,
//     optionally when one is left (EarlyExit), honours an allowed set, and
//     writes into a caller-owned Overlaps without allocating.
//   - The block table (table.go, bigset.go): sharded open addressing from
//     sequence hash to a worker set; sets of up to 3 workers (4 when their
//     slots are under 32,767) are inline in the table word, larger ones are
//     immutable sorted lists or bitmaps over dense worker slots (2 to
//     10,000+ workers, no map per block).
//   - Snapshots (snapshot.go, store.go): a versioned, checksummed binary
//     format with a bounds-checked decoder (fuzzed), and a JetStream
//     object-store layout in which each snapshot is its own object named
//     by its stream sequence, so a newer snapshot always wins and is never
//     overwritten by an older one. SnapshotStore.Verify lets the loader
//     refuse a well-formed but untrustworthy version (ahead of the stream)
//     and drop workers from it before it is restored.
//   - The approximate and predicted indexes (approx.go): fed by the
//     router's own routing decisions, with a TTL, a size cap and lazy
//     expiry tracked per Record call rather than per block. A record names
//     a prompt's leading blocks, so their sets nest along each prompt and
//     their lookups bisect once few workers are left (Index.bisect).
//   - Observability (stats.go): Stats, Dump, and WorkerBlocks, one
//     worker's block count kept as events apply (no walk).
//
// It does not own event transport, ordering, gap or epoch detection (the
// kvevents subscriber hands batches in order and calls Resync), deciding
// which worker gets a request (scheduler), worker membership (workers; the
// host calls RemoveWorker), or when to take snapshots (the host calls
// SaveSnapshot and, at start-up, LoadSnapshot before starting a subscriber
// at StreamSeq()+1). Nothing here touches NATS except store.go.
//
// Concurrency. Lookups take no lock and never wait: every table word is
// read atomically, and writers follow three rules (table.go) that make
// each read consistent on its own — bucket keys never change within a
// table, emptied blocks are marked dead rather than moved, and rebuilt
// tables are published by one pointer swap. Writers (the subscriber, the
// host's lifecycle calls) share one mutex taken once per batch; it orders
// every worker's writes and costs one lock per batch instead of one per
// block. BenchmarkReadPath compares this with the obvious alternative, a
// sharded map behind per-shard RWMutexes (one read-lock pair, two atomic
// read-modify-writes at about 11 ns each on the test VM, per block).
// A worker slot is reused only after all its entries are gone, and a
// lookup during which a slot was assigned runs again, noting each entry's
// slot, and discards any slot reassigned while it ran, so a removed
// worker's blocks never appear under the worker that inherits its slot.
//
// Memory. Stats reports entries, blocks, workers and an estimate of the
// bytes held (36 to 67 bytes per (block, worker) entry, measured by
// BenchmarkMemoryPerEntry; a sequence-keyed worker's entries have no
// engine map, and while every worker is sequence-keyed the block tables
// keep more headroom, capFor). Config.MaxEntries caps the entries: past it,
// new stores are refused and counted (the index under-reports, never
// over-reports, a worker's cache); removals go on. Config.MaxEntriesPerWorker
// and SetWorkerLimit (a replica sets it from the worker's registered size)
// cap each (worker, rank) the same way, so one flooding worker cannot take
// the budget of the others.
//
// Where to start reading: index.go (Config, Index, ApplyBatch), then
// lookup.go (Lookup), table.go (the lock-free protocol), snapshot.go and
// store.go (recovery), approx.go. The wire format of snapshots is in
// docs/protocol.md, benchmark figures in
// docs/benchmarks/index.md.
package index
