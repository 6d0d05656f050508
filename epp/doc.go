// Package epp is kvrouter as a Gateway API Inference Extension endpoint
// picker (EPP): an Envoy external processor (ext_proc v3, the
// bidirectional Process stream, bodies in FULL_DUPLEX_STREAMED mode) that
// tells an Envoy-based gateway which pod of an InferencePool serves each
// request, and the gRPC health service the gateway and Kubernetes ask.
//
// Per stream (stream.go): the request's headers are kept and its body
// buffered to its end (at most the gateway's MaxBodyBytes: larger is 413);
// a POST to /v1/chat/completions or /v1/completions is then read,
// tokenized and routed by the gateway package (Gateway.Prepare and
// Gateway.Route: the same parsing, tokenization, sessions, LoRA adapters,
// cache_salt and bookings as `kvrouter gateway`), restricted to the proxy's
// candidate subset when it sends one. The answer is the destination
// (x-gateway-destination-endpoint: the pick, then fallbacks, as ip:port) in
// a header mutation and in dynamic metadata envoy.lb, with route-cache
// clearing, then the body streamed back unchanged. A refusal is an
// ImmediateResponse with the gateway's status and OpenAI-shaped body (503
// when nothing is eligible, 429 when the router sheds). On the response
// path the first body chunk is prefill done and the end of the body (or of
// the stream, however it ends) frees the booking. envoy.go holds the
// protocol's names and message shapes; server.go the Server, its health
// service and metrics.
//
// It does not parse, tokenize or route itself (the gateway package and
// the router replicas do), forward requests (the proxy does), or know
// Kubernetes: a pod's ip:port is the endpoint its worker registered (the
// bridge's --advertise-addr). docs/epp.md is the user's documentation.
//
// Where to start reading: Server.Process in stream.go.
package epp
