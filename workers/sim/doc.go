// Package sim is a GPU-free model of an LLM inference engine (vLLM-style),
// faithful enough that the router, its index, the scheduler and the
// benchmarks can be tested and demonstrated on a laptop.
//
// It owns:
//
//   - the block KV cache (cache.go): prefix reuse by sequence hash, LRU
//     eviction of blocks no running request holds, leaf-first; one block per
//     sequence hash;
//   - the per-rank scheduler and step loop (core.go): continuous batching in
//     vLLM v1's unified form (running requests first, newest preempted when
//     memory runs out, then waiting requests FIFO), chunked prefill under
//     MaxBatchedTokens, at most MaxSeqs running, an admission watermark;
//     as vLLM v1, a prefix hit includes the blocks the step being planned
//     computes for an earlier request (core.planned);
//   - KV transfers (transfer.go): a request whose leading prompt blocks
//     arrived from a prefill engine (Request.Transferred) skips their
//     prefill and caches them; HeldPrefix names the blocks a rank holds;
//     Pull waits a decode leg's transfer time (Config.Transfer), for both
//     faces (the NATS endpoint's remote_decode/remote_blocks, vllmapi's
//     kv_transfer_params); Config.Role is what the worker registers as.
//   - LoRA adapters and cache salts (lora.go): a request's adapter and salt
//     are in its hash seed (kvevents.SeedFor); with Config.MaxLoRAs, at
//     most that many adapters per rank are resident (least recently used
//     out) and per step, and each load costs Config.LoRALoadTime;
//   - the timing model (timing.go): Dynamo mocker's polynomials, a speed-up
//     factor, and an injectable Clock (WallClock, or VirtualClock for tests
//     and fast replays);
//   - the events: Stored (as blocks become full, chunk by chunk; generated
//     tokens' blocks too unless SkipOutputBlocks), Removed (on eviction),
//     Cleared (Reset, Restart, Close), all on kvevents.TierDevice, sent
//     through EventEmitter (a *kvevents.Publisher, or a recorder in tests).
//     An emitter may also implement StepEmitter (told where each step ends)
//     and TokenEmitter (given a Stored event's tokens and BlockKeys: the
//     adapter, the salt and the blocks' multimodal (identifier, offset)
//     pairs).
//     The engine's block id is EngineHash(worker, rank, seq) = seq xor a
//     salt hashed from (worker, rank);
//   - multimodal prompts (media.go): a request's Media items (image
//     placeholder ranges with their identifiers) enter its blocks' hashes
//     as vLLM's extra keys do (kvevents.SeqHashesMedia), so different
//     images never share a cached block past their placeholders' start;
//   - the Go API (engine.go, stream.go): New, Submit → Stream, Run (step
//     loops on the clock), RunUntilIdle and AdvanceTo (synchronous, for
//     deterministic virtual-time simulations and trace replays), Restart
//     (new epoch, new emitters from EmitterFactory),
//     Reset, Reannounce, Close, Dump (ground truth for convergence tests),
//     Load (workers.LoadReport per rank), Info (workers.Info);
//   - the NATS generate protocol (serve.go, docs/protocol.md):
//     Serve answers on <prefix>.worker.<model>.<worker>.generate with
//     streamed chunks and a final message with ttft_ms, itl_ms, e2e_ms and
//     cached_tokens; Generate is the client; ExpandBlockIDs turns Mooncake
//     block ids into tokens identically for engine, bench client and router;
//   - vLLM's KV events over ZMQ (vllmevents.go): VLLMEvents publishes one
//     vLLM KVEventBatch per engine step on each rank's kvevents/vllmzmq
//     sockets (encoded by kvevents/vllm's Encoder), as an engine started
//     with --kv-events-config does;
//   - Fleet (fleet.go): N engines in one process, each with its publisher,
//     registration and load reporter, for `kvrouter worker --sim --count N`.
//
// It does not own: hashing, the wire format and the publisher (kvevents), the
// registry, membership and load subjects (workers), routing decisions, or
// trace parsing and replay (bench).
//
// Start reading at core.schedule and core.complete in core.go: one step is
// "schedule under the lock, sleep the step's time, complete under the lock".
package sim
