package host

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
	"go.opentelemetry.io/otel/attribute"
)

// sink hands the event subscriber's batches to the index of their model
// and counts what passes, for metrics. Batches of models this replica does
// not route are skipped.
type sink struct {
	r        *Replica
	hold     holdQueue // batches of workers not yet registered (unregistered.go)
	applied  atomic.Uint64
	foreign  atomic.Uint64
	gaps     atomic.Uint64
	epochs   atomic.Uint64
	lastSeq  atomic.Uint64
	lastTime atomic.Int64 // unix nanos of the last applied batch
}

func (s *sink) ApplyBatch(streamSeq uint64, b *kvevents.Batch) {
	ms, ok := s.r.models[b.Model]
	if !ok {
		s.foreign.Add(1)
		s.lastSeq.Store(streamSeq)
		return
	}
	if !s.apply(ms, streamSeq, b) { // held or dropped: its worker is not registered
		s.lastSeq.Store(streamSeq)
		return
	}
	s.r.m.eventBatches.Add(context.Background(), 1)
	s.applied.Add(1)
	s.lastSeq.Store(streamSeq)
	s.lastTime.Store(time.Now().UnixNano())
}

func (s *sink) Resync(sig kvevents.Signal) {
	kind := "gap"
	if sig.Kind == kvevents.SignalNewEpoch {
		kind = "new_epoch"
		s.epochs.Add(1)
	} else {
		s.gaps.Add(1)
	}
	s.r.m.resyncs.Add(context.Background(), 1, attr(attribute.String("kind", kind)))
	if ms, ok := s.r.models[sig.Model]; ok {
		ms.index.Resync(sig)
	}
	// Gaps are rare and worth a line; epochs happen at every worker start.
	if sig.Kind == kvevents.SignalGap {
		s.r.log.Warn("event gap: worker's index entries dropped until it refills", "model", sig.Model,
			"worker", sig.Worker, "rank", sig.Rank, "expected_id", sig.ExpectedID, "got_id", sig.GotID)
	} else {
		s.r.log.Debug("worker restarted: index entries of the old epoch dropped", "model", sig.Model,
			"worker", sig.Worker, "rank", sig.Rank, "old_epoch", sig.OldEpoch, "new_epoch", sig.NewEpoch)
	}
}

// Cursors reports where each (worker, rank) of every model's index stands,
// so a subscriber started after a snapshot restore checks the first batch
// of each worker against it (kvevents.CursorSource).
func (s *sink) Cursors() map[workerref.Target]kvevents.Cursor {
	out := map[workerref.Target]kvevents.Cursor{}
	for _, ms := range s.r.models {
		for k, c := range ms.index.Cursors() {
			out[k] = c
		}
	}
	return out
}

var _ kvevents.CursorSource = (*sink)(nil)

// startSubscriber starts the KV event subscriber at startSeq (0 = the
// beginning of the stream).
func (r *Replica) startSubscriber(ctx context.Context, startSeq uint64) error {
	sub, err := kvevents.NewSubscriber(r.js, kvevents.SubscriberConfig{
		Prefix:   r.cfg.Prefix,
		Stream:   r.cfg.EventStream,
		StartSeq: startSeq,
		Sink:     r.eventSink,
		Logger:   r.log.With("component", "kvevents.subscriber"),
	})
	if err != nil {
		return fmt.Errorf("host: event subscriber: %w", err)
	}
	r.subscriber = sub
	r.subStats.Store(sub)
	sctx, cancel := context.WithCancel(context.Background())
	r.subCancel = cancel
	r.subDone = make(chan struct{})
	go func() {
		defer close(r.subDone)
		if err := sub.Run(sctx); err != nil && sctx.Err() == nil {
			r.log.Error("event subscriber stopped", "err", err)
		}
	}()
	return nil
}

// lagLoop measures how far the subscriber is behind the stream (in
// messages) every second, for the kvr.events.lag gauge, and expires the
// predicted indexes' old entries.
func (r *Replica) lagLoop() {
	defer r.bg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		r.eventSink.expire(now)
		for _, ms := range r.models {
			if ms.pred != nil {
				ms.pred.Prune(now)
			}
		}
		if r.cfg.Approximate {
			continue // no event stream
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := r.js.Stream(ctx, r.cfg.EventStream)
		if err == nil {
			var info, err2 = st.Info(ctx)
			if err2 == nil {
				last := info.State.LastSeq
				// The subscriber's sequence counts skipped (bad, foreign,
				// duplicate) messages as consumed: a bad message last in the
				// stream must not hold the lag at 1 forever.
				applied := r.subscriber.LastSeq()
				if applied > last {
					applied = last
				}
				r.streamLast.Store(last)
				r.eventLag.Store(last - applied)
			}
		}
		cancel()
	}
}
