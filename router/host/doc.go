// Package host is one router replica. It owns one request's life
// (validate, hash, look up the prefix index, read the session binding,
// schedule, commit the binding, reply), the lifecycle calls (prefill done,
// free, cancel), worker membership, approximate mode (no events; the index
// is fed by routing decisions, Config.Approximate), and the two transports
// that serve the route API: NATS request/reply (queue group) and HTTP.
//
// Beside the request path sit two parts, each its own type that the
// request path reaches only through a small interface (replica.go):
//   - event intake, eventIntake (intake.go, intake_hold.go,
//     intake_snapshot.go): the event subscription into the indexes
//     (registered workers' events only, within the index budget:
//     config.go's IndexLimits; batches of workers not yet registered are
//     held), index snapshots (verified against the stream and the registry
//     before they are trusted) and the event lag. Membership tells it who
//     is registered (workerGate: admit, forget);
//   - replica-to-replica sync, peerSync (peersync.go,
//     peersync_bookings.go, peersync_decisions.go): booking sync (each
//     booking change, into the peers' schedulers) and decision sync (each
//     routing decision, into the peers' predicted or approximate index).
//     The request path hands it its side (peerSharer: shareBooking,
//     shareDecision) and never waits: the buffers (mailbox.go: one
//     publisher wake-up per batch, not per change) are bounded and drop.
//
// It does not own the wire contract (messages, errors, subjects, codecs,
// the decision sync format and the client are in router/api; booking sync's
// JSON stays in peersync_bookings.go because its events are the
// scheduler's), NATS connection setup (internal/natsconn) or exporters
// (internal/telemetry: the replica takes a MeterProvider and a
// TracerProvider in Config.Telemetry and a /metrics handler in
// Config.MetricsHandler). Nor does it own any routing rule: the pin rule and
// the policies live in router/scheduler, the commit rule (create, renew,
// re-bind, reject) in bindings, event ordering in kvevents' subscriber and
// the prefix index in router/index. The host calls each once per request;
// a binding's mode (session.Mode) is the scheduling requirement's as it is,
// and the single place where a dependency's error becomes an API error is
// mapError in maperr.go.
//
// Where to start reading:
//   - replica.go: New/Start/Close, what a replica sets up on start (each
//     step its own function) and how it becomes ready; the two parts'
//     interfaces (peerSharer, workerGate) and the background loops;
//   - route.go: Replica.route, one request's life (lookup -> requirement ->
//     select and bind -> commit -> reply); telemetry.go: its spans and
//     metrics (routeTelemetry, which does nothing unless a span records);
//     observe.go: the gauges read at collection time, one callback per area;
//     pd.go: a route that asks for a prefill/decode pair (bookPrefill,
//     with the local prefill rule, before the decode leg, completePD with
//     the single-worker rule after it; docs/pd.md);
//     adapters.go: what a request naming a LoRA adapter adds to it (the
//     workers holding the adapter, from the registry);
//   - natsapi.go and httpapi.go: the two transports over the same calls,
//     with their bounds (one in-flight cap for both, the HTTP token,
//     timeouts and body limit, the forwarding pool);
//   - fence.go: generated request ids, the booking fences lifecycle
//     calls must present, and checkOwner (fence, request key or an
//     operator's subject: who may free or cancel a request);
//   - members.go: worker membership and load reports;
//   - intake.go, then peersync.go: the two parts above (peer sync's two
//     streams share one subscription helper and one batching loop,
//     runBatches).
package host
