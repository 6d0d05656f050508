// Package api is the route API's wire contract: what a client, a bridge or
// a gateway needs to talk to router replicas, and nothing of the replica
// itself.
//
// It owns the versioned JSON messages (RouteRequest, RouteResponse, the
// lifecycle, workers, session and health messages), the error envelope with
// its codes and their HTTP statuses (errors.go), the NATS subjects and
// header names (subjects.go), the codecs (jsondec.go, jsonenc.go), the
// binary decision sync format replicas share their routing decisions in
// ("KVRD", decisions.go), the trace-context carrier for NATS headers
// (carrier.go), the NATS client (client.go), request keys (requestkey.go:
// ids a client makes with a key that proves it owns them, the fence of a
// cancel before any route reply), and media.go: the media field,
// RouteRequest.SeqHashes (the one rule from token ids, LoRA name, salt and
// media items to the hashes a replica looks up, shared with clients that
// hash themselves) and the client's fit under the server's max_payload
// (token ids, else block hashes, else payload_too_large). The worker target on the wire, WorkerRef, is
// workerref.Target with a JSON form.
//
// Codecs: the three messages on every route's path have hand-written
// decoders (jsondec.go: the route request; jsondec_reply.go: the route
// answer and the lifecycle call body), and the route answer a hand-written
// encoder, each kept because a benchmark beside it shows the need
// (json_test.go: 2,048-token requests, answers, lifecycle bodies; 3-4x
// encoding/json). Every other message is read with encoding/json through
// DecodeJSON, so HTTP and NATS share one decoder, one set of key rules and
// one set of error texts per message. The hand decoders match keys exactly,
// where encoding/json folds their case; otherwise both read the same
// message (fuzzed against encoding/json). A route request's token ids, or
// its block hashes, may follow its JSON in binary (the binary trailers,
// jsondec.go: a mark byte JSON never contains, then fixed-width
// little-endian values), which AppendRouteBody writes and Client sends.
//
// It does not route, hold state or start anything, and it must not link a
// NATS server, the OpenTelemetry SDK or Prometheus (deps_test.go): a binary
// that only routes requests links neither a server nor an exporter.
//
// Where to start reading: messages.go, then errors.go, then client.go.
package api
