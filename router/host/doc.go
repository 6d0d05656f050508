// Package host is one router replica: it owns one request's life (validate,
// hash, look up the prefix index, read the session binding, schedule, commit
// the binding, reply), the lifecycle calls (prefill done, free, cancel),
// worker membership, the event subscription into the index (registered
// workers' events only, within the index budget: unregistered.go,
// config.go's IndexLimits), index snapshots (verified against the stream
// and the registry before they are trusted, snapshot.go), replica booking sync and decision sync (each routing decision
// shared with the other replicas for their predicted or approximate index,
// decisions.go), approximate mode (no events; the index is fed by routing
// decisions, Config.Approximate), and the two transports that serve the
// route API: NATS request/reply (queue group) and HTTP.
//
// It does not own the wire contract (messages, errors, subjects, codecs and
// the client are in router/api), NATS connection setup (internal/natsconn)
// or exporters (internal/telemetry: the replica takes a MeterProvider and a
// TracerProvider in Config.Telemetry and a /metrics handler in
// Config.MetricsHandler). Nor does it own any routing rule: the pin rule and
// the policies live in router/scheduler, the commit rule (create, renew,
// re-bind, reject) in bindings, event ordering in kvevents' subscriber and
// the prefix index in router/index. The host calls each once per request;
// the single place where a binding's mode becomes a scheduling strength is
// strengthOf in route.go, and the single place where a dependency's error
// becomes an API error is mapError in maperr.go.
//
// Where to start reading:
//   - replica.go: New/Start/Close, what a replica sets up on start and how it
//     becomes ready;
//   - route.go: Replica.route, one request's life (lookup -> requirement ->
//     select and bind -> commit -> reply); telemetry.go: its spans and
//     metrics (routeTelemetry, which does nothing unless a span records);
//     adapters.go: what a request naming a LoRA adapter adds to it (the
//     workers holding the adapter, from the registry);
//   - natsapi.go and httpapi.go: the two transports over the same calls,
//     with their bounds (one in-flight cap for both, the HTTP token,
//     timeouts and body limit, the forwarding pool);
//   - fence.go: generated request ids and the booking fences lifecycle
//     calls must present;
//   - bookings.go and decisions.go: the two replica sync streams (one
//     subscription helper and one batching loop, runBatches).
package host
