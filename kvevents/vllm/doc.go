// Package vllm is vLLM's KV-event format on kvrouter's side: the
// KVEventBatch payload that vLLM, SGLang and TensorRT-LLM publish over ZMQ,
// read, turned into kvevents.Events, and written back.
//
// It owns:
//
//   - Decoding (decode.go): DecodeBatch reads every KVEventBatch shape those
//     engines publish (array or map envelope; positional or map events of
//     every vLLM version; uint64, negative int64 or bytes hashes) into a
//     reusable Batch of Events, without allocating on a steady stream.
//   - Conversion (convert.go): a Converter (one per engine and DP rank)
//     turns those events into kvevents.Events, hashing token_ids with
//     kvevents.SeqHashes and chaining children onto their parents'
//     sequence hashes; what it cannot convert it skips and counts
//     (ErrUnknownParent, ErrBlockSizeMismatch, ErrTokenCount, ErrBadMedia).
//     By default its events are engine-keyed (routers map engine hashes to
//     sequence hashes per worker); with ConverterConfig.SeqKeyed
//     (convert_seq.go) it keeps that map itself, counts the engine blocks
//     of each (sequence hash, tier), and returns sequence-keyed events for
//     a kvevents.Batch.SeqKeyed publisher: a Stored only of blocks new to
//     their tier, a Removed only of those the tier no longer holds.
//   - Multimodal extra keys (media.go): the (identifier, offset) pairs
//     vLLM publishes per block in extra_keys, decoded into Event.Media,
//     mixed into the blocks' hashes by the converter
//     (kvevents.SeqHashesKeyed, the router's rule for the same items) and
//     written back by the encoder.
//   - Encoding (encode.go): an Encoder writes a batch in vLLM's own bytes,
//     byte-identical to msgspec's, for the simulated engine (workers/sim).
//
// It does not own our event types, hashing or wire format (kvevents, which
// this package imports and which never imports it), the msgpack primitives
// (internal/msgpack), or the ZMQ transport (kvevents/vllmzmq, whose payload
// frame is what DecodeBatch reads). Decode errors wrap kvevents'
// ErrTruncated, ErrMalformed or ErrOversized.
//
// Tests decode vLLM's own payloads from testdata/vllm, copies of
// shared/testvectors/vllm (TestVLLMVectorCopiesMatchShared keeps them
// equal); docs/protocol.md ("vLLM interop") is the format's reference.
//
// Where to start reading: Event and Batch in decode.go, then DecodeBatch
// and decoder.event; then Converter.Convert in convert.go, and
// convertSeq in convert_seq.go for the sequence-keyed mode.
package vllm
