// Package msgpack is kvrouter's one msgpack reader and writer: the
// primitives both event wire formats are decoded and encoded with (ours in
// kvevents, vLLM's KVEventBatch in kvevents/vllm), and the bridge's
// salvage path splits a bad vLLM batch with.
//
// It owns a bounded Reader over a byte slice (every length prefix is
// checked against the bytes that remain before anything is sized from it;
// no method panics; errors wrap ErrTruncated, ErrMalformed or ErrOversized)
// and append-style writers that pick msgpack's smallest forms. It does not
// own any message layout: which fields a batch has, in which order, and
// what they mean belong to kvevents (wire.go) and kvevents/vllm.
//
// Why a leaf package under internal/ rather than exported from kvevents:
// kvevents/vllm and workers/bridge need the reader, and kvevents must not
// grow a general msgpack API beside its event types; here the primitives
// sit below every user, import only the standard library, and stay out of
// the module's public surface.
//
// Why written by hand rather than vmihailenco/msgpack: the same decoding
// steps on vmihailenco's low-level Decoder, which reads through an
// io.ByteScanner a byte at a time, are several times slower on every batch
// measured (BenchmarkMsgpackDecode in kvevents and kvevents/vllm; figures in
// docs/benchmarks/events.md). vmihailenco/msgpack stays a test dependency:
// the independent encoder tests build payloads with, and that benchmark's
// baseline (msgpacktest).
//
// Start reading at Reader in reader.go; writer.go holds the Append
// functions.
package msgpack
