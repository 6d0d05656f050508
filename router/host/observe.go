package host

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// registerObservers registers the gauges and counters read at collection
// time, one callback per area: scheduling (queue depth, bookings,
// per-worker predicted load), membership, readiness, the bindings table's
// reads, the NATS connection, and the two parts'
// own: event intake (index size, event lag and rejects: intake.go) and
// replica sync (dropped changes: peersync.go). Index.Stats locks each
// shard briefly, which is fine at scrape frequency and never on the
// request path.
func (r *Replica) registerObservers(m metric.Meter) error {
	for _, register := range []func(metric.Meter) error{
		r.observeScheduling, r.observeMembership, r.observeReady, r.observeBindings, r.observeNATS, r.intake.observe, r.peers.observe,
	} {
		if err := register(m); err != nil {
			return err
		}
	}
	return nil
}

// observables creates the instruments of one callback and registers it
// over them; the first error is kept and returned by register.
type observables struct {
	m   metric.Meter
	err error
	all []metric.Observable
}

func (o *observables) gauge(name, desc string, opts ...metric.Int64ObservableGaugeOption) metric.Int64ObservableGauge {
	g, err := o.m.Int64ObservableGauge(name, append(opts, metric.WithDescription(desc))...)
	o.add(g, err)
	return g
}

func (o *observables) floatGauge(name, desc string) metric.Float64ObservableGauge {
	g, err := o.m.Float64ObservableGauge(name, metric.WithDescription(desc))
	o.add(g, err)
	return g
}

func (o *observables) counter(name, desc string) metric.Int64ObservableCounter {
	c, err := o.m.Int64ObservableCounter(name, metric.WithDescription(desc))
	o.add(c, err)
	return c
}

func (o *observables) add(i metric.Observable, err error) {
	if err != nil {
		if o.err == nil {
			o.err = err
		}
		return
	}
	o.all = append(o.all, i)
}

func (o *observables) register(f metric.Callback) error {
	if o.err != nil {
		return o.err
	}
	_, err := o.m.RegisterCallback(f, o.all...)
	return err
}

// modelAttr is the attribute set of one model's series.
func modelAttr(name string) metric.ObserveOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("model", name)))
}

// observeScheduling registers, per model, the scheduler queue, this
// replica's bookings, the cached share its default cost follows, and the
// load it predicts on each worker rank (its own and its peers' bookings).
func (r *Replica) observeScheduling(m metric.Meter) error {
	o := observables{m: m}
	queueDepth := o.gauge("kvr.queue.depth", "Requests waiting in the scheduler queue, per model.")
	bookings := o.gauge("kvr.bookings", "Requests this replica has booked and not yet freed, per model.")
	cachedShare := o.floatGauge("kvr.scheduler.cached_share", "Share of the prompt blocks this replica routed lately that the chosen worker already held, per model: the estimate the default cost's decode-block weight follows.")
	loadActive := o.gauge("kvr.worker.predicted.active_requests", "Active requests this replica predicts on each worker rank (own and synced bookings).")
	loadPrefill := o.gauge("kvr.worker.predicted.prefill_tokens", "Prefill tokens this replica predicts in flight on each worker rank.")
	loadDecode := o.gauge("kvr.worker.predicted.decode_blocks", "Decode KV blocks this replica predicts booked on each worker rank.")
	return o.register(func(ctx context.Context, ob metric.Observer) error {
		for _, name := range r.modelList {
			ms := r.models[name]
			mo := modelAttr(name)
			st := ms.sched.Stats()
			ob.ObserveInt64(queueDepth, st.Waiting, mo)
			ob.ObserveFloat64(cachedShare, st.CachedShare, mo)
			ob.ObserveInt64(bookings, int64(ms.fences.len()), mo)
			loads, _ := ms.sched.Loads(ctx)
			for _, l := range loads {
				wo := metric.WithAttributeSet(attribute.NewSet(attribute.String("model", name),
					attribute.String("worker", l.Key.Worker), attribute.Int64("rank", int64(l.Key.Rank))))
				ob.ObserveInt64(loadActive, int64(l.ActiveRequests), wo)
				ob.ObserveInt64(loadPrefill, int64(l.PrefillTokens), wo)
				ob.ObserveInt64(loadDecode, int64(l.DecodeBlocks), wo)
			}
		}
		return nil
	})
}

// observeMembership registers the workers per model and state and what
// the membership view and the load subscription count: suspect workers
// (issue 15: a key that vanished is not a departure until the grace
// passes) and the registry entries and load reports rejected as bad input
// or as naming another worker than their key or subject (issue 16).
func (r *Replica) observeMembership(m metric.Meter) error {
	o := observables{m: m}
	workersG := o.gauge("kvr.workers", "Workers in the registry, per model, state and role (prefill, decode or both).")
	suspect := o.gauge("kvr.workers.suspect", "Workers whose registry key vanished without a deregistration, waiting (at most the departure grace) for it to come back.")
	suspected := o.counter("kvr.workers.suspected", "Times a worker's registry key vanished without a deregistration (each then came back or departed).")
	returned := o.counter("kvr.workers.returned", "Suspect workers whose registry key came back within the departure grace: not departed.")
	regRejected := o.counter("kvr.registry.rejected", "Registry entries ignored, by cause (malformed; mismatched: the worker id does not name the key).")
	loadRejected := o.counter("kvr.load_reports.rejected", "Load reports skipped, by cause (invalid; mismatched: the subject names another worker or model).")
	malformed, mismatched, invalid := causeAttr("malformed"), causeAttr("mismatched"), causeAttr("invalid")
	return o.register(func(_ context.Context, ob metric.Observer) error {
		for _, name := range r.modelList {
			type stateRole struct{ state, role string }
			counts := map[stateRole]int64{}
			for _, w := range r.models[name].workerList() {
				counts[stateRole{string(w.State), string(w.Role.Or())}]++
			}
			for k, n := range counts {
				ob.ObserveInt64(workersG, n, metric.WithAttributeSet(attribute.NewSet(attribute.String("model", name),
					attribute.String("state", k.state), attribute.String("role", k.role))))
			}
		}
		if mem := r.mem.Load(); mem != nil {
			st := mem.Stats()
			ob.ObserveInt64(suspect, int64(st.Suspect))
			ob.ObserveInt64(suspected, int64(st.Suspected))
			ob.ObserveInt64(returned, int64(st.Returned))
			ob.ObserveInt64(regRejected, int64(st.Malformed), malformed)
			ob.ObserveInt64(regRejected, int64(st.Mismatched), mismatched)
		}
		if ls := r.loadStats.Load(); ls != nil {
			_, bad := ls.Stats()
			ob.ObserveInt64(loadRejected, int64(bad), invalid)
			ob.ObserveInt64(loadRejected, int64(ls.Mismatched()), mismatched)
		}
		return nil
	})
}

// observeReady registers kvr.ready.
func (r *Replica) observeReady(m metric.Meter) error {
	o := observables{m: m}
	ready := o.gauge("kvr.ready", "1 when the replica serves requests (caught up with the event stream), else 0.")
	return o.register(func(_ context.Context, ob metric.Observer) error {
		ob.ObserveInt64(ready, boolGauge(r.IsReady()))
		return nil
	})
}

// observeBindings registers what the bindings table's reads cost: first
// reads sent to the stream leader because the local cache could not show
// it was fresh (staleness fallbacks) and all leader reads, whether the
// cache may answer now, and restarted watches (the table's Stats).
func (r *Replica) observeBindings(m metric.Meter) error {
	o := observables{m: m}
	stale := o.counter("kvr.bindings.stale_fallbacks", "Session binding reads sent to the stream leader because the local cache could not show it was at most --bindings-max-staleness behind.")
	leader := o.counter("kvr.bindings.leader_reads", "Session binding reads from the stream leader (Hard bindings, staleness fallbacks, confirmed misses).")
	fresh := o.gauge("kvr.bindings.cache_fresh", "1 when the local bindings cache is shown fresh enough to answer Soft reads, else 0.")
	restarts := o.counter("kvr.bindings.watch_restarts", "Bindings watches ended or found stalled and started again.")
	return o.register(func(_ context.Context, ob metric.Observer) error {
		table := r.tableObs.Load()
		if table == nil {
			return nil
		}
		st := table.Stats()
		ob.ObserveInt64(stale, int64(st.StaleFallbacks))
		ob.ObserveInt64(leader, int64(st.LeaderReads))
		ob.ObserveInt64(fresh, boolGauge(st.CacheFresh))
		ob.ObserveInt64(restarts, int64(st.WatchRestarts))
		return nil
	})
}

// observeNATS registers the replica's NATS connection: whether it is
// connected and how often it reconnected.
func (r *Replica) observeNATS(m metric.Meter) error {
	o := observables{m: m}
	connected := o.gauge("kvr.nats.connected", "1 while the replica's NATS connection is up, else 0.")
	reconnects := o.counter("kvr.nats.reconnects", "Reconnections of the replica's NATS connection.")
	return o.register(func(_ context.Context, ob metric.Observer) error {
		ob.ObserveInt64(connected, boolGauge(r.nc.IsConnected()))
		ob.ObserveInt64(reconnects, int64(r.nc.Stats().Reconnects))
		return nil
	})
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func causeAttr(c string) metric.ObserveOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("cause", c)))
}

// rejectCauses are the cause attributes of kvr.events.rejected, in the order
// of kvevents.SubscriberStats' Truncated, Malformed, Oversized, Mismatched,
// IDJumps.
func rejectCauses() [5]metric.ObserveOption {
	var out [5]metric.ObserveOption
	for i, c := range [...]string{"truncated", "malformed", "oversized", "mismatched", "id_jump"} {
		out[i] = causeAttr(c)
	}
	return out
}
