// Command kvrouter is the KV-cache-aware LLM request router: router
// replicas (serve), simulated workers (worker --sim), a one-command demo
// on an embedded NATS server (demo) and the benchmark harness (bench).
//
// It owns flags, environment variables (KVR_<FLAG>), the policy file and
// the wiring of the packages; it holds no routing logic of its own. Start
// at main.go (subcommand dispatch), then serve.go (router/host, with NATS
// from internal/natsconn and exporters from internal/telemetry), worker.go
// (workers/sim fleet), demo.go and bench.go (package bench); flags.go is
// the flag and environment machinery they share.
package main
