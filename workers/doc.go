// Package workers tells routers which workers exist, what each can hold,
// whether it is still alive, and how loaded it is.
//
// It owns three things:
//
//   - The registry (registry.go): one JetStream KV key per worker id in the
//     bucket "kvr-workers" (History 1, LimitMarkerTTL so per-key TTLs work).
//     Register creates the key with a per-key TTL (3 s) and a heartbeat
//     (1 s) renews it with a raw compare-and-set publish that carries a
//     fresh message TTL, because kv.Update would drop the TTL (the bucket
//     check, that publish, the mapping of codes 10071/10164 to ErrConflict
//     and the leader read of a key are internal/jskv's, shared with
//     bindings; the errors stay this package's). Register,
//     Registration.SetDraining, Deregister, Stop, and Drain (graceful stop,
//     drain.go) are the worker side.
//   - The membership view (membership.go): the router side. WatchMembership
//     follows the bucket and calls OnJoin, OnUpdate, OnSuspect and OnDepart.
//     A departure is confirmed only when certain: a deregistration (its
//     purge marker carries a body) or a KV delete, a drain deadline
//     (Info.DrainDeadline) that passed, or a key that expired and did not
//     come back within RegistryConfig.DepartureGrace (meanwhile the worker
//     is suspect: Live, not Available). A new epoch under the same id is
//     reported as OnDepart(old) then OnJoin(new). Load reports and
//     registry entries that name another worker than their subject or key
//     are rejected and counted apart (Mismatched).
//   - Load reports (load.go): JSON on core NATS subject
//     <prefix>.load.<model>.<worker>, published by a LoadReporter and read
//     with SubscribeLoad.
//
// The value format is Info (info.go), validated on both encode and decode;
// its Role (role.go) is the worker's part in a prefill/decode-disaggregated
// fleet;
// a malformed entry is counted and ignored by the view. Worker ids are
// escaped into registry keys by internal/escape's WorkerKey (KeyFor); names
// in subjects by its SubjectToken.
//
// It does not own: the simulated engine (workers/sim), KV-cache events
// (kvevents), what routers do on a departure (the router drops the worker
// from its index and scheduler; bindings ask Membership.Live), or load
// prediction (the scheduler). It must not import router/... or bindings.
//
// Start reading at Register in registry.go, then apply in membership.go.
// docs/protocol.md describes the keys, values and subjects.
package workers
