// Package bindings keeps session bindings (session -> worker) in a JetStream
// KV bucket and commits them by compare-and-swap, so that every router
// replica agrees on where a session lives.
//
// Start reading at (*Table).Route in route.go: it states the whole commit
// protocol (read, select, create / renew / re-bind / reject / keep the other
// writer's), and the host calls it once per request that has a session id.
// Then the commit type in commit.go, the commit rule at work: run and round,
// then one method per outcome (create, renew, reject, rebind, and ours and
// lost for writes that did not simply land). Then store.go (the raw
// JetStream operations: leader reads through $JS.API.STREAM.MSG.GET (a
// direct get on a one-replica stream),
// conditional writes that keep the per-key TTL, and the mapping of codes
// 10071 and 10164 to ErrConflict, built on internal/jskv, which workers
// share; bindings adds the ambiguous-outcome classification and its own
// errors), firstRead in table.go (the read rule: Hard bindings from the
// stream leader, Soft ones and absences from the cache only while it is
// provably at most MaxStaleness behind), watch.go (the watch that feeds the
// cache, the probe that proves its freshness, the restart of a stalled
// watch), cache.go (the bounded, watch-fed read cache), limits.go
// (MaxSessions and MaxBytes on the bucket), value.go (the stored JSON) and
// key.go (the key format, escaped by internal/escape's BindingKey).
//
// What it owns: the bucket (default "kvr-bindings", History 1, per-key TTL),
// the key and value format (docs/protocol.md), the commit rule (type commit
// in commit.go: a selection keeps a binding when their targets agree,
// workerref.Target.Agrees, the rule the scheduler's pin rule applies too),
// the read guarantee per mode, the idle TTL and its renewal (a binding
// outlives its session's last request by at least IdleTTL), the session cap,
// the single-flight of first requests within a replica, the resolution of
// writes whose outcome is unknown (leader read + nonce), and the counters
// (Stats). The target type is the shared leaf workerref's and the mode type
// (Hard, Soft, stored as "hard" or "soft") the shared leaf session's.
//
// What it does not own: choosing a worker (the Selector, i.e. the host's
// call into the scheduler, which applies the pin rule to the Requirement it
// is handed), knowing which workers are live (Config.Liveness, fed by the
// workers' membership view), metrics export (the host reads Stats), and the
// NATS connection (the caller's). It imports neither router nor workers.
package bindings
