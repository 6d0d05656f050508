// Package escape is the one way kvrouter turns a name (a model, a worker id,
// a session id) into a single token over a restricted alphabet and back, so
// that any name can sit in a NATS subject or a JetStream KV key.
//
// A Scheme keeps the bytes of its safe alphabet as they are and writes every
// other byte as its escape byte and two upper-case hex digits; the empty name
// is the escape byte alone. The places that need a token differ only in the
// escape byte and the alphabet, each defined next to the format it belongs to:
//
//   - kvevents.SubjectToken: subject tokens, '%' (printable ASCII except
//     '.', '*', '>' and '%' kept);
//   - workers.KeyFor: registry KV keys, '=' ([A-Za-z0-9_-] kept);
//   - bindings.Key: binding KV keys, '_' ([A-Za-z0-9-] kept).
//
// Those formats are on the wire and in stored buckets: their golden tests
// (one per package) pin today's bytes.
//
// Start reading at Scheme in scheme.go. The package is a leaf: it imports
// only the standard library.
package escape
