package host

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// eventIntake is the replica's event intake: the KV event subscription
// into the models' indexes (registered workers' events only: the hold in
// intake_hold.go), the index snapshots (intake_snapshot.go) and the event
// lag. It is the subscriber's sink: batches of models this replica does
// not route are skipped. The request path never calls it (it reads the
// indexes the intake fills); membership reaches it through workerGate.
type eventIntake struct {
	cfg       *Config // the replica's (read-only after New)
	log       *slog.Logger
	js        jetstream.JetStream
	m         *metrics
	models    map[string]*modelState
	modelList []string

	subscriber *kvevents.Subscriber
	subStats   atomic.Pointer[kvevents.Subscriber] // the subscriber, for metric callbacks that may run during Start
	subCancel  context.CancelFunc
	subDone    chan struct{}

	hold     holdQueue // batches of workers not yet registered (intake_hold.go)
	applied  atomic.Uint64
	foreign  atomic.Uint64
	gaps     atomic.Uint64
	epochs   atomic.Uint64
	lastSeq  atomic.Uint64
	lastTime atomic.Int64 // unix nanos of the last applied batch

	lag        atomic.Uint64 // stream messages not yet applied, measured every second
	streamLast atomic.Uint64 // last stream sequence seen by measureLag
}

var (
	_ kvevents.Sink         = (*eventIntake)(nil)
	_ kvevents.CursorSource = (*eventIntake)(nil)
	_ workerGate            = (*eventIntake)(nil)
)

func (in *eventIntake) ApplyBatch(streamSeq uint64, b *kvevents.Batch) {
	ms, ok := in.models[b.Model]
	if !ok {
		in.foreign.Add(1)
		in.lastSeq.Store(streamSeq)
		return
	}
	if !in.apply(ms, streamSeq, b) { // held or dropped: its worker is not registered
		in.lastSeq.Store(streamSeq)
		return
	}
	in.m.eventBatches.Add(context.Background(), 1)
	in.applied.Add(1)
	in.lastSeq.Store(streamSeq)
	in.lastTime.Store(time.Now().UnixNano())
}

func (in *eventIntake) Resync(sig kvevents.Signal) {
	kind := "gap"
	if sig.Kind == kvevents.SignalNewEpoch {
		kind = "new_epoch"
		in.epochs.Add(1)
	} else {
		in.gaps.Add(1)
	}
	in.m.resyncs.Add(context.Background(), 1, attr(attribute.String("kind", kind)))
	if ms, ok := in.models[sig.Model]; ok {
		ms.index.Resync(sig)
	}
	// Gaps are rare and worth a line; epochs happen at every worker start.
	if sig.Kind == kvevents.SignalGap {
		in.log.Warn("event gap: worker's index entries dropped until it refills", "model", sig.Model,
			"worker", sig.Worker, "rank", sig.Rank, "expected_id", sig.ExpectedID, "got_id", sig.GotID)
	} else {
		in.log.Debug("worker restarted: index entries of the old epoch dropped", "model", sig.Model,
			"worker", sig.Worker, "rank", sig.Rank, "old_epoch", sig.OldEpoch, "new_epoch", sig.NewEpoch)
	}
}

// Cursors reports where each (worker, rank) of every model's index stands,
// so a subscriber started after a snapshot restore checks the first batch
// of each worker against it (kvevents.CursorSource).
func (in *eventIntake) Cursors() map[workerref.Target]kvevents.Cursor {
	out := map[workerref.Target]kvevents.Cursor{}
	for _, ms := range in.models {
		for k, c := range ms.index.Cursors() {
			out[k] = c
		}
	}
	return out
}

// catchUp restores the indexes from the newest verified snapshots (when
// Config.LoadSnapshot), starts the subscriber where they end and waits
// until it has caught up with the stream. It returns the sequence the
// subscriber started at (0: the beginning of the stream).
func (in *eventIntake) catchUp(ctx context.Context) (uint64, error) {
	startSeq := uint64(0)
	if in.cfg.LoadSnapshot {
		startSeq = in.loadSnapshots(ctx)
	}
	if err := in.startSubscriber(startSeq); err != nil {
		return startSeq, err
	}
	if err := in.subscriber.WaitCaughtUp(ctx); err != nil {
		return startSeq, fmt.Errorf("host: catching up with event stream %s: %w", in.cfg.EventStream, err)
	}
	return startSeq, nil
}

// startSubscriber starts the KV event subscriber at startSeq (0 = the
// beginning of the stream).
func (in *eventIntake) startSubscriber(startSeq uint64) error {
	sub, err := kvevents.NewSubscriber(in.js, kvevents.SubscriberConfig{
		Prefix:   in.cfg.Prefix,
		Stream:   in.cfg.EventStream,
		StartSeq: startSeq,
		Sink:     in,
		Logger:   in.log.With("component", "kvevents.subscriber"),
	})
	if err != nil {
		return fmt.Errorf("host: event subscriber: %w", err)
	}
	in.subscriber = sub
	in.subStats.Store(sub)
	sctx, cancel := context.WithCancel(context.Background())
	in.subCancel = cancel
	in.subDone = make(chan struct{})
	go func() {
		defer close(in.subDone)
		if err := sub.Run(sctx); err != nil && sctx.Err() == nil {
			in.log.Error("event subscriber stopped", "err", err)
		}
	}()
	return nil
}

// stop stops the subscriber, if it was started, and waits for it.
func (in *eventIntake) stop() {
	if in.subCancel != nil {
		in.subCancel()
		<-in.subDone
	}
}

// subscribedSeq is the last stream sequence the subscriber has handled
// (0 before it starts, and in approximate mode).
func (in *eventIntake) subscribedSeq() uint64 {
	if in.subscriber == nil {
		return 0
	}
	return in.subscriber.LastSeq()
}

// measureLag measures how far the subscriber is behind the stream, in
// messages, for the kvr.events.lag gauge.
func (in *eventIntake) measureLag() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := in.js.Stream(ctx, in.cfg.EventStream)
	if err != nil {
		return
	}
	info, err := st.Info(ctx)
	if err != nil {
		return
	}
	last := info.State.LastSeq
	// The subscriber's sequence counts skipped (bad, foreign, duplicate)
	// messages as consumed: a bad message last in the stream must not hold
	// the lag at 1 forever.
	applied := in.subscriber.LastSeq()
	if applied > last {
		applied = last
	}
	in.streamLast.Store(last)
	in.lag.Store(last - applied)
}

// observe registers the index size per model and what the intake counts:
// the event lag, gaps, the last applied sequence and the messages rejected
// as bad input.
func (in *eventIntake) observe(m metric.Meter) error {
	o := observables{m: m}
	indexBlocks := o.gauge("kvr.index.blocks", "Distinct blocks (sequence hashes) in the prefix index, per model.")
	indexEntries := o.gauge("kvr.index.entries", "(block, worker) entries in the prefix index, per model.")
	indexBytes := o.gauge("kvr.index.bytes", "Estimated memory held by the prefix index, per model.", metric.WithUnit("By"))
	refused := o.counter("kvr.index.refused_stores", "Stored blocks not indexed because the index or the worker rank was at its cap, per model.")
	eventLag := o.gauge("kvr.events.lag", "KV event stream messages not yet applied to the index (measured every second).")
	eventGaps := o.counter("kvr.events.gaps", "Per-worker event id gaps detected by the subscriber.")
	streamSeq := o.gauge("kvr.events.applied_seq", "Last KV event stream sequence handed to the index.")
	rejected := o.counter("kvr.events.rejected", "KV event messages skipped as bad input, by cause (truncated, malformed, oversized, mismatched, id_jump).")
	causes := rejectCauses()
	return o.register(func(_ context.Context, ob metric.Observer) error {
		for _, name := range in.modelList {
			mo := modelAttr(name)
			st := in.models[name].index.Stats()
			ob.ObserveInt64(indexBlocks, int64(st.Blocks), mo)
			ob.ObserveInt64(indexEntries, st.Entries, mo)
			ob.ObserveInt64(indexBytes, st.Bytes, mo)
			ob.ObserveInt64(refused, int64(st.RefusedStores), mo)
		}
		if sub := in.subStats.Load(); sub != nil {
			st := sub.Stats()
			for i, n := range [...]uint64{st.Truncated, st.Malformed, st.Oversized, st.Mismatched, st.IDJumps} {
				ob.ObserveInt64(rejected, int64(n), causes[i])
			}
		}
		ob.ObserveInt64(eventLag, int64(in.lag.Load()))
		ob.ObserveInt64(eventGaps, int64(in.gaps.Load()))
		ob.ObserveInt64(streamSeq, int64(in.lastSeq.Load()))
		return nil
	})
}
