// Package escape is the one way kvrouter turns a name (a model, a worker id,
// a session id) into a single token over a restricted alphabet and back, so
// that any name can sit in a NATS subject or a JetStream KV key.
//
// A Scheme keeps the bytes of its safe alphabet as they are and writes every
// other byte as its escape byte and two upper-case hex digits; the empty name
// is the escape byte alone. The places that need a token differ only in the
// escape byte and the alphabet; the three schemes, each named for what it
// escapes, are defined side by side in schemes.go:
//
//   - SubjectToken: a name in a NATS subject (event, load, generate and
//     route API subjects, event message ids), '%' (printable ASCII except
//     '.', '*', '>' and '%' kept);
//   - WorkerKey: a worker id as its registry KV key (workers.KeyFor), '='
//     ([A-Za-z0-9_-] kept);
//   - BindingKey: a model or session id as one token of a binding's KV key
//     (bindings.Key), '_' ([A-Za-z0-9-] kept).
//
// Those formats are on the wire and in stored buckets: golden tests pin
// today's bytes (SubjectToken's in schemes_test.go, the keys' through
// workers.KeyFor and bindings.Key in those packages).
//
// Start reading at Scheme in scheme.go. The package is a leaf: it imports
// only the standard library.
package escape
