// Package vllmzmq is vLLM's KV-event transport over ZeroMQ, both sides, in
// pure Go (github.com/go-zeromq/zmq4: no cgo, no libzmq): what a vLLM engine
// opens when started with --kv-events-config, and what a router-side bridge
// uses to follow it. The payloads are kvevents/vllm's business (Encoder,
// DecodeBatch); this package moves opaque frames.
//
// It owns:
//
//   - Config (config.go): vLLM's --kv-events-config JSON field for field
//     with vLLM's defaults, ParseKVEventsConfig, the bind-or-connect rule
//     (Binds) and the data-parallel endpoint rule (OffsetEndpoint,
//     Config.ForRank);
//   - Publisher (publisher.go): one per data-parallel rank; a PUB socket
//     sending [topic, seq, payload] with an 8-byte big-endian seq from 0
//     per process start, and a ROUTER replay socket over a ring of the last
//     buffer_steps batches;
//   - the client side (subscriber.go): Subscriber (a SUB socket yielding
//     Messages, malformed ones counted and skipped) and Replay (a DEALER
//     request for every buffered batch from a seq);
//   - what both sides share about zmq4 sockets (sockets.go): bind or
//     connect, options, dialable addresses.
//
// Start reading at Publisher.Publish and Publisher.answer.
//
// Following a rank without losing anything, in short (what a bridge does):
// open a Subscriber, then Replay from the seq you expect (0 for a fresh
// start); apply the replayed batches, then live messages, skipping seqs
// already applied. A live seq above the expected one is a gap: Replay from
// the expected seq. A replay whose first batch is above the seq asked for
// (ReplayResult.Late) lost batches: clear the rank and apply what follows.
// A seq below the expected one means the engine restarted, so its cache
// is empty: clear the rank and continue from that seq.
//
// Where it differs from vLLM: the PUB high-water mark bounds one queue that
// all subscribers share (zmq4 has no per-subscriber queues), so one slow
// subscriber can make all of them drop; max_queue_size is accepted but
// unused (no queue sits between engine and socket); the replay socket also
// answers a bare DEALER request without the empty delimiter (vLLM ignores
// those).
package vllmzmq
