// Package realpath holds end-to-end tests over the real path a request and
// a KV event take in production, with no shortcut: simulated engines shaped
// like `kvrouter sim serve` (vLLM's HTTP face on a real listener, KV events
// over real ZMQ PUB and replay sockets), one workers/bridge per engine (ZMQ
// SUB and replay, /health and /metrics scrapes, registry registration),
// two router replicas (router/host) on an embedded NATS server, and
// gateways (gateway) in front, driven by the official OpenAI Go client.
// Everything the tests read from the routers comes through their public
// faces: GET /v1/workers and the route API. media_test.go runs chats with
// images (engines with and without vLLM's render endpoint);
// longprompt_test.go runs the stack on a nats-server from
// deploy/nats/auth.conf, every component logged in as its role.
//
// The package has no code of its own; start reading at realpath_test.go:
// startStack builds the whole path, converged is the exact comparison of
// the routers' indexes with the engines' caches (sim.Engine.Dump), and
// each test says in its comment what it checks. shapes_test.go holds the
// table of request shapes (tools, template options, completions, engines
// without render endpoints, ...) over which the router's predicted overlap
// must equal the engine's cached_tokens, one row per shape; agent_test.go
// runs an agent workload (tool calls and results) through the same check
// and compares its hit ratio with and without tool definitions; pd_test.go
// runs a prefill/decode-disaggregated fleet (docs/pd.md) through a gateway
// in PD mode, vLLM's and SGLang's protocols.
package realpath
