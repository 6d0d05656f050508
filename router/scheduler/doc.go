// Package scheduler decides, for one router replica, when a request is
// admitted, which workers may take it, which one does, and books the
// request's predicted load there.
//
// # What it owns
//
//   - The admission point (scheduler.go): one lock per Scheduler
//     serialises admit, select and book, so two selections never both see
//     a worker's spare capacity (a replica never oversubscribes its own
//     view). Every call runs on its caller's goroutine under that lock (no
//     hand-off to another goroutine and back); the goroutine Start runs
//     only fires the deadline timer and the guard. Its inputs and outputs (Request, Decision, WorkerInfo,
//     BookingEvent) are in types.go, its Config in config.go.
//   - The queue (queue.go): strict priority tiers; FCFS or WSPT (shortest
//     uncached work first) inside a tier; per-class limits (ErrOverloaded,
//     HTTP 529); deadlines (ErrDeadline); pinned lanes; drained on
//     prefill-done, free, load reports and membership changes; long waiters
//     get their overlaps refreshed (Config.Refresh) before selection.
//   - Eligibility (fleet.go, Thresholds in config.go): a worker is a
//     candidate when known, inside the request's allowed set, available
//     (registered, not draining) and not overloaded (Thresholds, adjustable
//     at run time with SetThresholds); a draining worker
//     (WorkerInfo.Draining) is a candidate only for a Hard requirement that
//     names it (the pin rule). A request waits in the router only when
//     every worker it may use is busy (the queue thresholds).
//   - The pin rule: applyPinRule in pinrule.go. It is the one place where an
//     explicit pin, a Hard or Soft affinity requirement and a classifier's
//     suggestion limit admission and selection, and the one place that
//     decides whether a pin agrees with an affinity target
//     (workerref.Target.Agrees, the rule the bindings table applies too:
//     same worker, same rank where both name one; the pair is then exact on
//     the more specific target, and a disagreeing pair is ErrPinConflict
//     before selection). selectWorker (same file) executes
//     its plan. No policy handles Hard itself.
//   - Policies: the Policy, Filter, Scorer and Picker interfaces and the
//     Candidates and Context a policy reads (policy.go); the default policy,
//     its cost model CostParams and the fused min-cost passes (cost.go),
//     with the LoRA adapter term: a worker that does not hold the
//     request's adapter pays its load (adapters.go); the scheduler's
//     running estimates a policy reads in its Context, the cached share of
//     recent selections and the share that waited in the admission queue,
//     which the default's decode-block weight follows (cachedshare.go);
//     softmax sampling, shared by the default policy and the softmax picker
//     (sampling.go); the llm-d style Pipeline of Filters, weighted Scorers
//     and a Picker, with the builtin parts (pipeline.go); round-robin,
//     random, least-loaded and power-of-two (simple.go); the peers'
//     algorithms llmd, sglang, dynamo and chwbl, with each peer's own
//     admission and session affinity (Operation), and two-tier, SGLang's
//     decision with least-loaded picks (peers.go); and a Registry that
//     builds them by name from YAML (registry.go). Policies are pure; only
//     the queue books (a policy may say whether output blocks are booked,
//     OutputBlockTracker, and whether a prefix booked on a worker counts
//     as cached there, BookedPrefixCounter: the default's view, applied
//     where the overlaps are resolved, core.prepare in pinrule.go).
//   - Booking (booking.go): predicted prefill tokens, decode blocks (prompt
//     blocks shared with other active requests on a worker counted once,
//     via per-hash refcounts in an open-addressing table, holders.go) and active requests; PrefillDone, Free and
//     Rollback fenced by (request id, worker, attempt); a guard that expires
//     bookings whose request vanished; remote bookings from other replicas
//     (OnBookingChange / ApplyRemote) and worker load reports (ObserveLoad)
//     folded into one struct-of-arrays load view (fleet.go).
//
// # What it does not own
//
// No NATS, no bindings, no index: the host moves BookingEvents between
// replicas, reads and commits session bindings (a binding's mode, the leaf
// session's Mode, is its Affinity's as it is), asks the index for overlaps and passes them in Request.Overlaps
// (this package's own Overlap type), feeds membership (UpsertWorker,
// RemoveWorker) and load reports, and calls PrefillDone/Free/Rollback over a
// request's life. The worker-and-rank target of pins, affinities and
// classifiers is the shared leaf type workerref.Target.
//
// # Where to start reading
//
// Prefill/decode disaggregation (pd.go): worker roles (WorkerInfo.Role) and
// request legs (Request.Leg) narrow eligibility by role, and the default
// policy scores a decode leg with DecodeCostParams; the host asks for the two
// legs as two requests (docs/pd.md). A decode leg on a decode-only worker
// charges it no prefill; Scheduler.ServeWhole moves a decode leg's prompt
// tokens onto or off its worker's prefill load (booking.go).
//
// pinrule.go (applyPinRule, then selectWorker), then queue.go (submit, pump,
// admit), then policy.go (Policy, Candidates), cost.go (DefaultPolicy) and
// registry.go (NewRegistry lists every builtin by name), then booking.go.
// The wire form of BookingEvent and the policy YAML are in docs/protocol.md.
package scheduler
