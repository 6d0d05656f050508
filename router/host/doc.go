// Package host is one router replica: it owns one request's life (validate,
// hash, look up the prefix index, read the session binding, schedule, commit
// the binding, reply) and the edges that talk to the outside world: the route
// API over NATS request/reply (queue group) and HTTP, the lifecycle calls
// (prefill done, free, cancel), replica booking sync, decision sync (each
// routing decision shared with the other replicas for their predicted or
// approximate index, decisions.go), approximate mode (no events; the index
// is fed by routing decisions, Config.Approximate), index snapshots, and
// the replica's observability (OpenTelemetry traces and metrics, slog).
//
// It does not own any routing rule. The pin rule and the policies live in
// router/scheduler, the commit rule (create, renew, re-bind, reject) lives in
// bindings, event ordering lives in kvevents' subscriber and the prefix index
// in router/index. The host calls each once per request; the single place
// where a binding's mode becomes a scheduling strength is strengthOf in
// route.go.
//
// Where to start reading:
//   - api.go: the versioned JSON messages (route, lifecycle, workers,
//     sessions) and errors.go: the error envelope and its status codes;
//   - replica.go: New/Start/Close, what a replica sets up on start and how it
//     becomes ready;
//   - route.go: Replica.Route, one request's life;
//   - natsapi.go and httpapi.go: the two transports over the same calls;
//   - telemetry.go: spans, metrics and the NATS header carrier for trace
//     context (carrier.go).
package host
