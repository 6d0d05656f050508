// Package kvevents is kvrouter's KV-cache event plane: how a worker's cache
// changes become router-side sequence hashes, travel over NATS JetStream, and
// reach each router replica's index in order, with loss and restarts made
// explicit.
//
// It owns:
//
//   - Block hashing (hash.go): NVIDIA Dynamo's definition, so the same
//     tokens give the same keys in both systems. Per block, XXH3-64 over the
//     token ids as little-endian uint32 with seed 1337 (SeedFor mixes a LoRA
//     name and cache salt into the seed); seq[0] = local[0],
//     seq[i] = XXH3-64(LE64(seq[i-1]) || LE64(local[i]), seed 1337); full
//     blocks only. Routers hash request tokens with SeqHashes; engines'
//     events are rehashed the same way, so engine hashes are never compared
//     across workers.
//   - Multimodal items in the hash (media.go): a block overlapping an
//     image's placeholder tokens gets the item's (identifier, offset) pair
//     mixed into its local hash, as vLLM puts it in extra_keys; routers
//     hash items with SeqHashesMedia, engines' per-block pairs are rehashed
//     with SeqHashesKeyed, and an item whose identifier the router does not
//     know ends its hashes before the item.
//   - Subjects (subject.go): <prefix>.events.<model>.<worker>, names escaped
//     one-to-one by internal/escape's SubjectToken.
//   - Our wire format (wire.go): a versioned positional msgpack Batch,
//     encoded and decoded by hand over internal/msgpack's bounded byte
//     reader (several times faster than vmihailenco/msgpack's Decoder on the
//     same batches: BenchmarkMsgpackDecode); every field is documented in
//     docs/protocol.md. Version 1 names blocks by engine hash; version 2
//     (Batch.SeqKeyed) by sequence hash alone, its publisher having counted
//     engine blocks per sequence hash and tier, so routers keep no engine
//     map. The decoding errors (ErrTruncated, ErrMalformed, ErrOversized)
//     are named here for every decoder of events.
//   - The Publisher (publisher.go): per (worker, rank), batches, numbers
//     events from 1, publishes in order with a dedup id, retries, and a
//     bounded buffer that fails loudly (ErrBufferFull) rather than block or
//     drop silently.
//   - The Subscriber (subscriber.go): an ordered consumer from any stream
//     sequence that hands batches to a Sink and turns id gaps and epoch
//     changes into Resync signals; bad input is counted and skipped, and
//     logged under two bounds (loglimit.go): one line per subject per
//     interval, and SubscriberConfig.MaxLogLines over all subjects, then
//     one summary line.
//   - The KVR_EVENTS stream definition (stream.go): SetUpStream for its
//     owner, the router replica (create when missing, else verify and
//     warn or update: jskv.Owner); LookupStream for the worker side (wait
//     for it, never create or change it; ErrStreamMissing); EnsureStream
//     (create or update) for tests and single-process tools.
//
// It does not own the prefix index that consumes batches (router/index
// implements Sink), the engine processes or simulators that produce events
// (workers, workers/sim), vLLM's event format (kvevents/vllm: its decoder,
// the converter into our Events, and its encoder; it imports kvevents, never
// the other way), the ZMQ transport of vLLM's event stream
// (kvevents/vllmzmq), the msgpack primitives (internal/msgpack), or
// snapshots (the index records a stream sequence and restarts a Subscriber
// from it).
//
// Where to start reading: types.go (the shared Event and Batch), then
// hash.go, then publisher.go and subscriber.go for the flow; wire.go is our
// decoder and encoder, built on internal/msgpack's Reader.
//
// Ordering and loss, in short: event ids are per (worker, rank), start at 1
// and have no holes; the epoch is random per publisher process. The
// subscriber delivers a batch whose first id is the expected one; skips one
// it has fully seen (a duplicate store or a replay overlap), trims one it
// has partly seen to its new tail; on a higher first id it sends
// Resync(SignalGap), on a different epoch Resync(SignalNewEpoch), and then
// delivers the batch. A first id more than SubscriberConfig.MaxIDJump
// (2^20) from the expected one, either way, is ignored and counted
// (IDJumps) unless the worker's next batch continues it: then the jump was
// real and is a gap. One forged id cannot move a worker's baseline, and no
// baseline, however far off, can stop a worker's real batches. The first batch it sees for a worker is applied
// without a signal unless the Sink implements CursorSource (a sink restored
// from a snapshot), in which case it is checked against the sink's cursor.
package kvevents
