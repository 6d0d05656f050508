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

// Replica booking sync. Each replica publishes its own booking changes
// (add, prefill_done, free) on <prefix>.bookings.<model> and folds the
// other replicas' into its scheduler, so every replica sees the fleet's
// predicted load. Messages are JSON arrays of scheduler.BookingEvent,
// batched for at most BookingSyncInterval; the buffer is bounded (changes
// past it are dropped and counted; the workers' load reports correct the
// drift). A replica ignores its own echoes. Peers read a message with
// encoding/json; it is written by appendBookingBatch, which writes exactly
// what json.Marshal would (tested) without its three allocations per event
// (BenchmarkBookingBatchEncode: they showed in every route's allocations).

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

// onBookingChange is the scheduler's hook: it must not block (it runs in
// the scheduler's actor).
func (r *Replica) onBookingChange(ms *modelState, ev scheduler.BookingEvent) {
	if ev.Kind == scheduler.BookingFree && ev.Replica == r.id {
		// Expired or rolled back: the request id no longer has a booking.
		ms.fences.del(scheduler.Fence{RequestID: ev.RequestID, Worker: workerKeyOf(ev.Worker, ev.Rank), Attempt: ev.Attempt})
	}
	select {
	case ms.bookings <- ev:
	default:
		if ms.dropped.Add(1)&1023 == 1 {
			r.log.Warn("booking sync buffer full: changes dropped (load reports will correct)", "model", ms.name,
				"dropped", ms.dropped.Load())
		}
	}
}

func (r *Replica) startBookingSync() error {
	for _, name := range r.modelList {
		ms := r.models[name]
		var b bookingBatch // reused: the handler runs on one goroutine
		if err := r.subscribeSync(api.BookingsSubject(r.cfg.Prefix, name), func(m *nats.Msg) { r.onRemoteBookings(ms, m, &b) }); err != nil {
			return fmt.Errorf("host: booking sync of %q: %w", name, err)
		}
		r.bg.Add(1)
		go r.publishBookings(ms)
	}
	return nil
}

func (r *Replica) onRemoteBookings(ms *modelState, m *nats.Msg, b *bookingBatch) {
	if r.ownEcho(m) {
		return
	}
	b.V, b.Replica, b.Events = 0, "", b.Events[:0]
	if err := json.Unmarshal(m.Data, b); err != nil || b.V != 1 {
		r.m.bookingSync.Add(context.Background(), 1, attr(attribute.String("direction", "bad")))
		return
	}
	if b.Replica == r.id {
		return // own echo
	}
	for _, ev := range b.Events {
		if ev.Replica == r.id {
			continue
		}
		ms.sched.ApplyRemote(ev)
	}
	r.m.bookingSync.Add(context.Background(), int64(len(b.Events)), attr(attribute.String("direction", "applied")))
}

// publishBookings batches the model's booking changes and publishes them
// until the replica stops, then flushes what is left.
func (r *Replica) publishBookings(ms *modelState) {
	defer r.bg.Done()
	subject := api.BookingsSubject(r.cfg.Prefix, ms.name)
	batch := bookingBatch{V: 1, Replica: r.id}
	sentOpt := attr(attribute.String("direction", "sent"))
	hdr := nats.Header{api.HeaderReplica: []string{r.id}}
	var buf []byte
	flush := func() {
		if len(batch.Events) == 0 {
			return
		}
		buf = appendBookingBatch(buf[:0], &batch)
		if err := r.nc.PublishMsg(&nats.Msg{Subject: subject, Header: hdr, Data: buf}); err != nil {
			r.log.Debug("booking sync publish failed", "err", err)
		} else {
			r.m.bookingSync.Add(context.Background(), int64(len(batch.Events)), sentOpt)
		}
		batch.Events = batch.Events[:0]
	}
	add := func(ev scheduler.BookingEvent) bool {
		batch.Events = append(batch.Events, ev)
		return len(batch.Events) >= maxBookingBatch
	}
	runBatches(r.stop, ms.bookings, r.cfg.BookingSyncInterval, add, flush)
}

// subscribeSync subscribes one replica-sync subject (every replica, no
// queue group) with a pending limit large enough for bursts; Close
// unsubscribes it.
func (r *Replica) subscribeSync(subject string, h nats.MsgHandler) error {
	sub, err := r.nc.Subscribe(subject, h)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subject, err)
	}
	if err := sub.SetPendingLimits(-1, 256<<20); err != nil {
		return fmt.Errorf("subscribe %s: pending limits: %w", subject, err)
	}
	r.syncSubs = append(r.syncSubs, sub)
	return nil
}

// ownEcho reports whether a sync message was published by this replica
// (its Kvr-Replica header), so it is dropped before decoding.
func (r *Replica) ownEcho(m *nats.Msg) bool { return m.Header.Get(api.HeaderReplica) == r.id }

// runBatches is the loop of one outgoing sync stream: it hands each item
// of in to add (which reports a full batch, flushed at once), flushes a
// batch at most every after its first item, and on stop adds what is
// still queued and flushes a last time.
func runBatches[T any](stop <-chan struct{}, in <-chan T, every time.Duration, add func(T) (full bool), flush func()) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		select {
		case it := <-in:
			if add(it) {
				flush()
			} else if !armed {
				timer.Reset(every)
				armed = true
			}
		case <-timer.C:
			armed = false
			flush()
		case <-stop:
			for {
				select {
				case it := <-in:
					if add(it) {
						flush()
					}
				default:
					flush()
					return
				}
			}
		}
	}
}
