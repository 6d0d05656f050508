// Package realpath holds end-to-end tests over the real path a request and
// a KV event take in production, with no shortcut: simulated engines shaped
// like `kvrouter sim serve` (vLLM's HTTP face on a real listener, KV events
// over real ZMQ PUB and replay sockets), one workers/bridge per engine (ZMQ
// SUB and replay, /health and /metrics scrapes, registry registration),
// router replicas (router/host) on an embedded NATS server, and a gateway
// (gateway) in front, driven by the official OpenAI Go client.
//
// The package has no code of its own; start reading at realpath_test.go:
// startStack builds the whole path, the tests check what comes out of it.
package realpath
