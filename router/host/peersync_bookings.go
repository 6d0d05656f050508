package host

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
)

// Booking sync, one of peerSync's two streams. Each replica publishes its
// own booking changes (add, prefill_done, free) on <prefix>.bookings.<model>
// and folds the other replicas' into its scheduler, so every replica sees
// the fleet's predicted load. Messages are JSON arrays of
// scheduler.BookingEvent, batched for at most BookingSyncInterval; the
// buffer is bounded (changes past it are dropped and counted; the workers'
// load reports correct the drift). A replica ignores its own echoes. Peers
// read a message with encoding/json; it is written by appendBookingBatch,
// which writes exactly what json.Marshal would (tested) without its three
// allocations per event (BenchmarkBookingBatchEncode: they showed in every
// route's allocations). The format lives here, not in router/api with the
// decision format: its events are scheduler.BookingEvent, which the wire
// contract must not import (router/api/deps_test.go).

// bookingBatch is the wire form: {"v":1,"replica":"r-1","events":[...]}.
type bookingBatch struct {
	V       int                      `json:"v"`
	Replica string                   `json:"replica"`
	Events  []scheduler.BookingEvent `json:"events"`
}

// appendBookingBatch appends b as JSON (what json.Marshal writes, without
// its per-event allocations).
func appendBookingBatch(dst []byte, b *bookingBatch) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(b.V), 10)
	dst = append(dst, `,"replica":`...)
	dst = api.AppendJSONString(dst, b.Replica)
	dst = append(dst, `,"events":[`...)
	for i := range b.Events {
		ev := &b.Events[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"replica":`...)
		dst = api.AppendJSONString(dst, ev.Replica)
		dst = append(dst, `,"seq":`...)
		dst = strconv.AppendUint(dst, ev.Seq, 10)
		dst = append(dst, `,"kind":`...)
		dst = api.AppendJSONString(dst, ev.Kind.String())
		dst = append(dst, `,"request_id":`...)
		dst = api.AppendJSONString(dst, ev.RequestID)
		dst = append(dst, `,"worker":`...)
		dst = api.AppendJSONString(dst, ev.Worker)
		dst = append(dst, `,"rank":`...)
		dst = strconv.AppendUint(dst, uint64(ev.Rank), 10)
		dst = append(dst, `,"attempt":`...)
		dst = strconv.AppendUint(dst, ev.Attempt, 10)
		if ev.PrefillTokens != 0 {
			dst = append(dst, `,"prefill_tokens":`...)
			dst = strconv.AppendInt(dst, int64(ev.PrefillTokens), 10)
		}
		if ev.Blocks != 0 {
			dst = append(dst, `,"blocks":`...)
			dst = strconv.AppendInt(dst, int64(ev.Blocks), 10)
		}
		dst = append(dst, `,"at":"`...)
		dst = ev.At.AppendFormat(dst, time.RFC3339Nano)
		dst = append(dst, `"}`...)
	}
	return append(dst, "]}"...)
}

// maxBookingBatch bounds one message (about 200 bytes per event).
const maxBookingBatch = 512

// shareBooking queues a local booking change for the peers. It must not
// block: it runs under the scheduler's lock.
func (p *peerSync) shareBooking(ms *modelState, ev scheduler.BookingEvent) {
	if !ms.peers.bookings.put(ev) {
		if ms.peers.dropped.Add(1)&1023 == 1 {
			p.log.Warn("booking sync buffer full: changes dropped (load reports will correct)", "model", ms.name,
				"dropped", ms.peers.dropped.Load())
		}
	}
}

// startBookings subscribes to the peers' booking changes of ms and starts
// publishing its own.
func (p *peerSync) startBookings(ms *modelState) error {
	var b bookingBatch // reused: the handler runs on one goroutine
	if err := p.subscribe(api.BookingsSubject(p.prefix, ms.name), func(m *nats.Msg) { p.onRemoteBookings(ms, m, &b) }); err != nil {
		return fmt.Errorf("host: booking sync of %q: %w", ms.name, err)
	}
	p.bg.run(func(stop <-chan struct{}) { p.publishBookings(ms, stop) })
	return nil
}

func (p *peerSync) onRemoteBookings(ms *modelState, m *nats.Msg, b *bookingBatch) {
	if p.ownEcho(m) {
		return
	}
	b.V, b.Replica, b.Events = 0, "", b.Events[:0]
	if err := json.Unmarshal(m.Data, b); err != nil || b.V != 1 {
		p.m.bookingSync.Add(context.Background(), 1, attr(attribute.String("direction", "bad")))
		return
	}
	if b.Replica == p.id {
		return // own echo
	}
	for _, ev := range b.Events {
		if ev.Replica == p.id {
			continue
		}
		ms.sched.ApplyRemote(ev)
	}
	p.m.bookingSync.Add(context.Background(), int64(len(b.Events)), attr(attribute.String("direction", "applied")))
}

// publishBookings batches the model's booking changes and publishes them
// until stop closes, then flushes what is left.
func (p *peerSync) publishBookings(ms *modelState, stop <-chan struct{}) {
	subject := api.BookingsSubject(p.prefix, ms.name)
	batch := bookingBatch{V: 1, Replica: p.id}
	sentOpt := attr(attribute.String("direction", "sent"))
	hdr := nats.Header{api.HeaderReplica: []string{p.id}}
	var buf []byte
	flush := func() {
		if len(batch.Events) == 0 {
			return
		}
		buf = appendBookingBatch(buf[:0], &batch)
		if err := p.nc.PublishMsg(&nats.Msg{Subject: subject, Header: hdr, Data: buf}); err != nil {
			p.log.Debug("booking sync publish failed", "err", err)
		} else {
			p.m.bookingSync.Add(context.Background(), int64(len(batch.Events)), sentOpt)
		}
		batch.Events = batch.Events[:0]
	}
	add := func(ev scheduler.BookingEvent) bool {
		batch.Events = append(batch.Events, ev)
		return len(batch.Events) >= maxBookingBatch
	}
	runBatches(stop, ms.peers.bookings, p.every, add, flush)
}
