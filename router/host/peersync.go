package host

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"
)

// peerSync is replica-to-replica sync: two streams per model, every
// replica publishing its own side and folding in its peers'. Booking sync
// (peersync_bookings.go) carries booking changes into the peers'
// schedulers, so every replica sees the fleet's predicted load; decision
// sync (peersync_decisions.go) carries routing decisions into the peers'
// predicted (or approximate) indexes. The request path hands it its side
// through peerSharer and never waits: each outgoing buffer is bounded and
// drops (and counts) when full. Both streams share one subscription
// helper (subscribe, ownEcho) and one batching loop (runBatches); their
// loops run on the replica's background loops.
type peerSync struct {
	nc     *nats.Conn
	id     string // this replica
	prefix string
	every  time.Duration // Config.BookingSyncInterval: the longest a change waits to be sent
	log    *slog.Logger
	m      *metrics
	bg     *loops
	models []*modelState // in Config.Models order
	subs   []*nats.Subscription
}

var _ peerSharer = (*peerSync)(nil)

// modelSync is one model's replica sync state: its outgoing buffers and
// counters.
type modelSync struct {
	bookings *mailbox[scheduler.BookingEvent] // local booking changes to publish
	dropped  atomic.Uint64                    // booking changes dropped (buffer full)

	decisions  *mailbox[decisionOut] // local decisions to share with the peers; nil when off
	decDropped atomic.Uint64         // decisions not shared (buffer full)
	decBad     atomic.Uint64         // undecodable decision messages received
	decApplied atomic.Uint64         // peers' decisions recorded
}

// init makes the outgoing buffers: decisions only when the model has a
// predicted index to feed and decision sync is on.
func (s *modelSync) init(bookings, decisions int, predicted bool) {
	s.bookings = newMailbox[scheduler.BookingEvent](bookings, maxBookingBatch)
	if predicted && decisions > 0 {
		s.decisions = newMailbox[decisionOut](decisions, api.MaxDecisionsPerMsg)
	}
}

// start subscribes to the peers' booking changes, then their decisions,
// of every model and starts the publishing loops.
func (p *peerSync) start() error {
	for _, ms := range p.models {
		if err := p.startBookings(ms); err != nil {
			return err
		}
	}
	for _, ms := range p.models {
		if ms.peers.decisions == nil {
			continue
		}
		if err := p.startDecisions(ms); err != nil {
			return err
		}
	}
	return nil
}

// unsubscribe stops taking the peers' messages. The publishing loops end
// with the replica's background loops, flushing what is buffered.
func (p *peerSync) unsubscribe() {
	for _, s := range p.subs {
		_ = s.Unsubscribe()
	}
}

// subscribe subscribes one replica-sync subject (every replica, no queue
// group) with a pending limit large enough for bursts; unsubscribe ends it.
func (p *peerSync) subscribe(subject string, h nats.MsgHandler) error {
	sub, err := p.nc.Subscribe(subject, h)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subject, err)
	}
	if err := sub.SetPendingLimits(-1, 256<<20); err != nil {
		return fmt.Errorf("subscribe %s: pending limits: %w", subject, err)
	}
	p.subs = append(p.subs, sub)
	return nil
}

// ownEcho reports whether a sync message was published by this replica
// (its Kvr-Replica header), so it is dropped before decoding.
func (p *peerSync) ownEcho(m *nats.Msg) bool { return m.Header.Get(api.HeaderReplica) == p.id }

// runBatches is the loop of one outgoing sync stream: it hands the items
// of in to add (which reports a full batch, flushed at once) and flushes,
// at most every after a batch's first item, or at once when in holds a
// full batch; on stop it does so a last time. It sleeps between the
// first item and the flush (in wakes it for neither the items between
// nor, below a full batch, their number).
func runBatches[T any](stop <-chan struct{}, in *mailbox[T], every time.Duration, add func(T) (full bool), flush func()) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	var items []T
	send := func() {
		items = in.take(items)
		for _, it := range items {
			if add(it) {
				flush()
			}
		}
		flush()
	}
	for {
		select {
		case <-in.wake:
			if in.len() >= in.full {
				send()
			} else if !armed {
				timer.Reset(every)
				armed = true
			}
		case <-timer.C:
			armed = false
			send()
		case <-stop:
			send()
			return
		}
	}
}

// observe registers, per model, the booking changes and decisions not
// shared because an outgoing buffer was full.
func (p *peerSync) observe(m metric.Meter) error {
	o := observables{m: m}
	syncDropped := o.counter("kvr.booking_sync.dropped", "Booking changes not published because the sync buffer was full.")
	decDropped := o.counter("kvr.decision_sync.dropped", "Routing decisions not shared with the other replicas because the outgoing buffer was full.")
	return o.register(func(_ context.Context, ob metric.Observer) error {
		for _, ms := range p.models {
			mo := modelAttr(ms.name)
			ob.ObserveInt64(syncDropped, int64(ms.peers.dropped.Load()), mo)
			ob.ObserveInt64(decDropped, int64(ms.peers.decDropped.Load()), mo)
		}
		return nil
	})
}
