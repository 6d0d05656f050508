package host

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// registerObservers registers the gauges read at collection time: queue
// depth, index size, event lag, per-worker predicted load, membership and
// readiness. Index.Stats locks each shard briefly, which is fine at scrape
// frequency and never on the request path.
func (r *Replica) registerObservers(m metric.Meter) error {
	queueDepth, err := m.Int64ObservableGauge("kvr.queue.depth",
		metric.WithDescription("Requests waiting in the scheduler queue, per model."))
	if err != nil {
		return err
	}
	indexBlocks, err := m.Int64ObservableGauge("kvr.index.blocks",
		metric.WithDescription("Distinct blocks (sequence hashes) in the prefix index, per model."))
	if err != nil {
		return err
	}
	indexEntries, err := m.Int64ObservableGauge("kvr.index.entries",
		metric.WithDescription("(block, worker) entries in the prefix index, per model."))
	if err != nil {
		return err
	}
	indexBytes, err := m.Int64ObservableGauge("kvr.index.bytes", metric.WithUnit("By"),
		metric.WithDescription("Estimated memory held by the prefix index, per model."))
	if err != nil {
		return err
	}
	eventLag, err := m.Int64ObservableGauge("kvr.events.lag",
		metric.WithDescription("KV event stream messages not yet applied to the index (measured every second)."))
	if err != nil {
		return err
	}
	eventGaps, err := m.Int64ObservableCounter("kvr.events.gaps",
		metric.WithDescription("Per-worker event id gaps detected by the subscriber."))
	if err != nil {
		return err
	}
	streamSeq, err := m.Int64ObservableGauge("kvr.events.applied_seq",
		metric.WithDescription("Last KV event stream sequence handed to the index."))
	if err != nil {
		return err
	}
	workersG, err := m.Int64ObservableGauge("kvr.workers",
		metric.WithDescription("Workers in the registry, per model and state."))
	if err != nil {
		return err
	}
	loadActive, err := m.Int64ObservableGauge("kvr.worker.predicted.active_requests",
		metric.WithDescription("Active requests this replica predicts on each worker rank (own and synced bookings)."))
	if err != nil {
		return err
	}
	loadPrefill, err := m.Int64ObservableGauge("kvr.worker.predicted.prefill_tokens",
		metric.WithDescription("Prefill tokens this replica predicts in flight on each worker rank."))
	if err != nil {
		return err
	}
	loadDecode, err := m.Int64ObservableGauge("kvr.worker.predicted.decode_blocks",
		metric.WithDescription("Decode KV blocks this replica predicts booked on each worker rank."))
	if err != nil {
		return err
	}
	bookingsG, err := m.Int64ObservableGauge("kvr.bookings",
		metric.WithDescription("Requests this replica has booked and not yet freed, per model."))
	if err != nil {
		return err
	}
	ready, err := m.Int64ObservableGauge("kvr.ready",
		metric.WithDescription("1 when the replica serves requests (caught up with the event stream), else 0."))
	if err != nil {
		return err
	}
	syncDropped, err := m.Int64ObservableCounter("kvr.booking_sync.dropped",
		metric.WithDescription("Booking changes not published because the sync buffer was full."))
	if err != nil {
		return err
	}
	decDropped, err := m.Int64ObservableCounter("kvr.decision_sync.dropped",
		metric.WithDescription("Routing decisions not shared with the other replicas because the outgoing buffer was full."))
	if err != nil {
		return err
	}
	rejected, err := m.Int64ObservableCounter("kvr.events.rejected",
		metric.WithDescription("KV event messages skipped as bad input, by cause (truncated, malformed, oversized, mismatched, id_jump)."))
	if err != nil {
		return err
	}
	refused, err := m.Int64ObservableCounter("kvr.index.refused_stores",
		metric.WithDescription("Stored blocks not indexed because the index or the worker rank was at its cap, per model."))
	if err != nil {
		return err
	}
	causes := rejectCauses()
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		for _, name := range r.modelList {
			ms := r.models[name]
			mo := metric.WithAttributeSet(attribute.NewSet(attribute.String("model", name)))
			st := ms.index.Stats()
			o.ObserveInt64(indexBlocks, int64(st.Blocks), mo)
			o.ObserveInt64(indexEntries, st.Entries, mo)
			o.ObserveInt64(indexBytes, st.Bytes, mo)
			o.ObserveInt64(refused, int64(st.RefusedStores), mo)
			ss := ms.sched.Stats()
			o.ObserveInt64(queueDepth, ss.Waiting, mo)
			o.ObserveInt64(bookingsG, int64(ms.fences.len()), mo)
			o.ObserveInt64(syncDropped, int64(ms.dropped.Load()), mo)
			o.ObserveInt64(decDropped, int64(ms.decDropped.Load()), mo)
			loads, _ := ms.sched.Loads(ctx)
			for _, l := range loads {
				wo := metric.WithAttributeSet(attribute.NewSet(attribute.String("model", name),
					attribute.String("worker", l.Key.Worker), attribute.Int64("rank", int64(l.Key.Rank))))
				o.ObserveInt64(loadActive, int64(l.ActiveRequests), wo)
				o.ObserveInt64(loadPrefill, int64(l.PrefillTokens), wo)
				o.ObserveInt64(loadDecode, int64(l.DecodeBlocks), wo)
			}
			counts := map[string]int64{}
			for _, w := range ms.workerList() {
				counts[string(w.State)]++
			}
			for state, n := range counts {
				o.ObserveInt64(workersG, n, metric.WithAttributeSet(attribute.NewSet(attribute.String("model", name), attribute.String("state", state))))
			}
		}
		if sub := r.subStats.Load(); sub != nil {
			st := sub.Stats()
			for i, n := range [...]uint64{st.Truncated, st.Malformed, st.Oversized, st.Mismatched, st.IDJumps} {
				o.ObserveInt64(rejected, int64(n), causes[i])
			}
		}
		o.ObserveInt64(eventLag, int64(r.eventLag.Load()))
		o.ObserveInt64(eventGaps, int64(r.eventSink.gaps.Load()))
		o.ObserveInt64(streamSeq, int64(r.eventSink.lastSeq.Load()))
		v := int64(0)
		if r.IsReady() {
			v = 1
		}
		o.ObserveInt64(ready, v)
		return nil
	}, queueDepth, indexBlocks, indexEntries, indexBytes, eventLag, eventGaps, streamSeq, workersG,
		loadActive, loadPrefill, loadDecode, bookingsG, ready, syncDropped, decDropped, rejected, refused)
	return err
}

// rejectCauses are the cause attributes of kvr.events.rejected, in the order
// of kvevents.SubscriberStats' Truncated, Malformed, Oversized, Mismatched,
// IDJumps.
func rejectCauses() [5]metric.ObserveOption {
	var out [5]metric.ObserveOption
	for i, c := range [...]string{"truncated", "malformed", "oversized", "mismatched", "id_jump"} {
		out[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("cause", c)))
	}
	return out
}
