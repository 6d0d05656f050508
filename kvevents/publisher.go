package kvevents

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/internal/escape"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/msgpack"
)

var (
	// ErrBufferFull: Emit found the publisher's bounded buffer full. The
	// event was not accepted; see PublisherConfig.KeepAfterReject for what
	// the publisher tells routers about it.
	ErrBufferFull = errors.New("kvevents: event buffer full")
	// ErrClosed: the publisher was closed.
	ErrClosed = errors.New("kvevents: publisher closed")
)

// Publisher defaults.
const (
	DefaultMaxBatchEvents = 512
	DefaultMaxDelay       = 2 * time.Millisecond
	DefaultBufferEvents   = 1 << 16
)

// PublisherConfig configures a Publisher for one (worker, rank).
type PublisherConfig struct {
	Prefix string // subject prefix; default DefaultPrefix
	Model  string // required
	Worker string // required
	Rank   uint32
	// Epoch identifies this process's event sequence. 0 = a random non-zero
	// value, which is what a worker process should use: a restart then shows
	// up at every router as a new epoch (empty cache).
	Epoch uint64

	// MaxBatchEvents caps the events in one published message (default 512).
	// Batches are also capped in bytes by the connection's max payload.
	MaxBatchEvents int
	// MaxDelay is how long the first event of a batch waits for company
	// before the batch is sent (default 2ms). Flush and Close skip it.
	MaxDelay time.Duration
	// BufferEvents bounds the events emitted but not yet acknowledged by the
	// stream (default 65,536). Emit beyond it fails with ErrBufferFull.
	BufferEvents int
	// KeepAfterReject turns off the resync marker. By default, after Emit
	// rejected an event the publisher puts a KindCleared event before the
	// next accepted one, so routers drop what they hold for this worker
	// rather than keep blocks whose removal may have been lost. They
	// under-count until the worker stores the blocks again; they never keep
	// phantom blocks.
	KeepAfterReject bool
	// SeqKeyed publishes sequence-keyed batches (Batch.SeqKeyed, wire
	// version 2): every event must name its blocks by sequence hash only,
	// and the caller keeps the per-(sequence hash, tier) counts that field
	// describes. Routers of a release before version 2 refuse such batches,
	// so routers are upgraded before their publishers turn this on.
	SeqKeyed bool

	// PublishTimeout bounds one publish attempt (default 5s).
	PublishTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between attempts of the same
	// batch (defaults 10ms and 1s). Retries reuse the batch's Nats-Msg-Id,
	// so one that follows a lost ack is stored once (within the stream's
	// Duplicates window).
	RetryMin, RetryMax time.Duration

	Logger      *slog.Logger
	LogInterval time.Duration // rate limit of repeated error logs; default 10s
}

// PublisherStats counts what a Publisher did.
type PublisherStats struct {
	Emitted       uint64 // events accepted by Emit (resync markers included)
	Rejected      uint64 // Emit calls refused with ErrBufferFull
	ResyncMarkers uint64 // KindCleared events injected after a rejection
	Batches       uint64 // messages acknowledged by the stream
	Published     uint64 // events acknowledged by the stream
	Duplicates    uint64 // acks that said "duplicate": a retry of a stored batch
	PublishErrors uint64 // failed publish attempts (each retried)
	Unacked       uint64 // events emitted and not yet acknowledged
}

// Publisher batches one (worker, rank)'s events and publishes them to the
// event stream in order. Emit encodes (and so copies) each event into a
// pending buffer; one sender goroutine takes the pending events, cuts them
// into batches and publishes each with a synchronous JetStream publish,
// retrying the same batch (same Nats-Msg-Id, see MsgID) until it is
// acknowledged. Event ids start at 1
// and are consecutive. Safe for concurrent use.
type Publisher struct {
	js       jetstream.JetStream
	cfg      PublisherConfig
	subject  string
	msgID    string // Nats-Msg-Id prefix: MsgID without the first event id
	epoch    uint64
	maxBytes int // batch payload limit
	log      *logLimiter

	mu       sync.Mutex
	pending  []byte // encoded events not yet taken by the sender
	ends     []int  // end offset of each pending event in pending
	firstAt  time.Time
	nextID   uint64 // id of the next accepted event
	takenID  uint64 // id of the first pending event
	acked    uint64 // every id <= acked is acknowledged
	rejected bool
	closed   bool
	flushReq bool
	progress chan struct{} // closed and replaced when acked advances or the sender stops

	wake    chan struct{}
	stop    context.CancelFunc
	done    chan struct{}
	stopped bool // sender goroutine has exited (under mu)

	emitted, rejectedN, markers, batches, published, dups, pubErrs atomic.Uint64
}

// NewPublisher validates cfg, fills defaults and starts the sender. The
// stream covering the subject must exist (EnsureStream).
func NewPublisher(js jetstream.JetStream, cfg PublisherConfig) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("kvevents: NewPublisher: nil JetStream")
	}
	if cfg.Model == "" || cfg.Worker == "" {
		return nil, fmt.Errorf("kvevents: NewPublisher: model %q and worker %q are required", cfg.Model, cfg.Worker)
	}
	if len(cfg.Model) > MaxNameBytes || len(cfg.Worker) > MaxNameBytes {
		return nil, fmt.Errorf("kvevents: NewPublisher: model or worker name longer than %d bytes", MaxNameBytes)
	}
	if cfg.MaxBatchEvents <= 0 {
		cfg.MaxBatchEvents = DefaultMaxBatchEvents
	}
	cfg.MaxBatchEvents = min(cfg.MaxBatchEvents, MaxBatchEvents)
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = DefaultMaxDelay
	}
	if cfg.BufferEvents <= 0 {
		cfg.BufferEvents = DefaultBufferEvents
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 5 * time.Second
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 10 * time.Millisecond
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(time.Second, cfg.RetryMin)
	}
	if cfg.Epoch == 0 {
		cfg.Epoch = randomEpoch()
	}
	maxBytes := MaxBatchBytes
	if nc := js.Conn(); nc != nil {
		if mp := int(nc.MaxPayload()); mp > 0 {
			// Leave room for the batch header and the message headers.
			maxBytes = min(maxBytes, mp-4096)
		}
	}
	if maxBytes < 1024 {
		return nil, fmt.Errorf("kvevents: NewPublisher: server max payload too small (%d bytes usable)", maxBytes)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{
		js: js, cfg: cfg, epoch: cfg.Epoch, maxBytes: maxBytes,
		subject:  EventSubject(cfg.Prefix, cfg.Model, cfg.Worker),
		msgID:    msgIDPrefix(cfg.Model, cfg.Worker, cfg.Rank, cfg.Epoch),
		log:      newLogLimiter(cfg.Logger, cfg.LogInterval, 0),
		nextID:   1,
		takenID:  1,
		progress: make(chan struct{}),
		wake:     make(chan struct{}, 1),
		stop:     cancel,
		done:     make(chan struct{}),
	}
	go p.run(ctx)
	return p, nil
}

func randomEpoch() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24)
		if e := binary.LittleEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}

// Epoch returns the publisher's epoch.
func (p *Publisher) Epoch() uint64 { return p.epoch }

// Subject returns the subject the publisher publishes on.
func (p *Publisher) Subject() string { return p.subject }

// Emit queues ev for publishing and returns at once. It copies ev (the
// caller may reuse its slices). It fails with ErrBufferFull (wrapped with
// the worker's name) when BufferEvents events are already waiting for
// acknowledgement, with ErrInvalidBatch for an event that cannot be encoded
// or does not fit in one message, and with ErrClosed after Close.
func (p *Publisher) Emit(ev Event) error {
	switch ev.Kind {
	case KindStored, KindRemoved, KindCleared:
	default:
		return fmt.Errorf("%w: worker %q: event kind %d", ErrInvalidBatch, p.cfg.Worker, ev.Kind)
	}
	if len(ev.Blocks) > MaxEventBlocks || len(ev.Removed) > MaxEventBlocks || len(ev.RemovedSeqs) > MaxEventBlocks {
		return fmt.Errorf("%w: worker %q: event with more than %d blocks", ErrInvalidBatch, p.cfg.Worker, MaxEventBlocks)
	}
	if err := checkKeying(&ev, p.cfg.SeqKeyed); err != nil {
		return fmt.Errorf("worker %q: %w", p.cfg.Worker, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("kvevents: publisher %s/%d: %w", p.cfg.Worker, p.cfg.Rank, ErrClosed)
	}
	need := uint64(1)
	marker := p.rejected && !p.cfg.KeepAfterReject
	if marker {
		need = 2
	}
	unacked := p.nextID - 1 - p.acked
	if unacked+need > uint64(p.cfg.BufferEvents) {
		p.rejected = true
		p.rejectedN.Add(1)
		return fmt.Errorf("kvevents: publisher %s/%d: %w (%d events unacknowledged, limit %d)",
			p.cfg.Worker, p.cfg.Rank, ErrBufferFull, unacked, p.cfg.BufferEvents)
	}
	start := len(p.pending)
	if marker {
		p.pending = appendKeyed(p.pending, &Event{Kind: KindCleared}, p.cfg.SeqKeyed)
		p.ends = append(p.ends, len(p.pending))
	}
	p.pending = appendKeyed(p.pending, &ev, p.cfg.SeqKeyed)
	if len(p.pending)-start > p.maxBytes-64 {
		p.pending = p.pending[:start]
		if marker {
			p.ends = p.ends[:len(p.ends)-1]
		}
		return fmt.Errorf("%w: worker %q: event of %d blocks does not fit in one message of %d bytes",
			ErrInvalidBatch, p.cfg.Worker, len(ev.Blocks)+len(ev.Removed)+len(ev.RemovedSeqs), p.maxBytes)
	}
	p.ends = append(p.ends, len(p.pending))
	if marker {
		p.rejected = false
		p.markers.Add(1)
	}
	p.nextID += need
	p.emitted.Add(need)
	if len(p.ends) == int(need) {
		p.firstAt = time.Now()
		p.signal()
	} else if len(p.ends) >= p.cfg.MaxBatchEvents || len(p.pending) >= p.maxBytes {
		p.signal()
	}
	return nil
}

func (p *Publisher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Flush waits until every event emitted before the call is acknowledged by
// the stream, or ctx is done. Pending events are sent without waiting for
// MaxDelay.
func (p *Publisher) Flush(ctx context.Context) error {
	p.mu.Lock()
	target := p.nextID - 1
	for {
		if p.acked >= target {
			p.mu.Unlock()
			return nil
		}
		if p.stopped {
			n := target - p.acked
			p.mu.Unlock()
			return fmt.Errorf("kvevents: publisher %s/%d: %w with %d events unacknowledged", p.cfg.Worker, p.cfg.Rank, ErrClosed, n)
		}
		p.flushReq = true
		p.signal()
		ch := p.progress
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			p.mu.Lock()
			n := target - p.acked
			p.mu.Unlock()
			if n == 0 {
				return nil
			}
			return fmt.Errorf("kvevents: publisher %s/%d: flush with %d events unacknowledged: %w", p.cfg.Worker, p.cfg.Rank, n, ctx.Err())
		}
		p.mu.Lock()
	}
}

// Close stops accepting events, flushes what was emitted (bounded by ctx)
// and stops the sender. Events still unacknowledged when ctx ends are
// abandoned and reported in the error. Close is idempotent.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.Flush(ctx)
	p.stop()
	<-p.done
	return err
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	unacked := p.nextID - 1 - p.acked
	p.mu.Unlock()
	return PublisherStats{
		Emitted: p.emitted.Load(), Rejected: p.rejectedN.Load(), ResyncMarkers: p.markers.Load(),
		Batches: p.batches.Load(), Published: p.published.Load(), Duplicates: p.dups.Load(),
		PublishErrors: p.pubErrs.Load(), Unacked: unacked,
	}
}

// run is the sender goroutine: the only publisher of this (worker, rank),
// so batches leave in id order.
func (p *Publisher) run(ctx context.Context) {
	defer func() {
		p.mu.Lock()
		p.stopped = true
		close(p.progress)
		p.progress = make(chan struct{})
		p.mu.Unlock()
		close(p.done)
	}()
	var (
		ends        []int
		buf, msgBuf []byte
		timer       = time.NewTimer(time.Hour)
	)
	timer.Stop()
	defer timer.Stop()
	for {
		// Wait for events, then for the batch to fill or MaxDelay to pass.
		p.mu.Lock()
		for len(p.ends) == 0 {
			p.flushReq = false
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
			}
			p.mu.Lock()
		}
		if wait := p.cfg.MaxDelay - time.Since(p.firstAt); wait > 0 && !p.flushReq && !p.closed &&
			len(p.ends) < p.cfg.MaxBatchEvents && len(p.pending) < p.maxBytes {
			p.mu.Unlock()
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			case <-p.wake: // more events, a flush, or Close: re-evaluate
				timer.Stop()
				continue
			}
			p.mu.Lock()
		}
		// Take everything pending by swapping buffers.
		firstID := p.takenID
		buf, p.pending = p.pending, buf[:0]
		ends, p.ends = p.ends, ends[:0]
		p.takenID += uint64(len(ends))
		p.mu.Unlock()

		// Publish in batches bounded by count and bytes.
		start, startOff := 0, 0
		for start < len(ends) {
			end := start + 1
			for end < len(ends) && end-start < p.cfg.MaxBatchEvents && ends[end]-startOff <= p.maxBytes {
				end++
			}
			id := firstID + uint64(start)
			msgBuf = p.appendHeader(msgBuf[:0], id, end-start)
			msgBuf = append(msgBuf, buf[startOff:ends[end-1]]...)
			if !p.publish(ctx, msgBuf, id, end-start) {
				return
			}
			start, startOff = end, ends[end-1]
		}
	}
}

// appendHeader writes the batch array up to the events array header; the
// events follow already encoded.
func (p *Publisher) appendHeader(dst []byte, firstID uint64, n int) []byte {
	dst = msgpack.AppendArrayHeader(dst, minBatchArrayLen)
	dst = msgpack.AppendUint(dst, wireVersion(p.cfg.SeqKeyed))
	dst = msgpack.AppendStr(dst, p.cfg.Model)
	dst = msgpack.AppendStr(dst, p.cfg.Worker)
	dst = msgpack.AppendUint(dst, uint64(p.cfg.Rank))
	dst = msgpack.AppendUint(dst, p.epoch)
	dst = msgpack.AppendUint(dst, firstID)
	return msgpack.AppendArrayHeader(dst, n)
}

// MsgID returns the Nats-Msg-Id of the batch of (model, worker, rank) in
// epoch whose first event is firstID:
// "<model token>.<worker token>.<rank>.<epoch>.<firstID>", numbers in
// decimal, names escaped by escape.SubjectToken. The stream deduplicates ids across
// all its subjects, so the id names everything that scopes an event id:
// ranks of one worker process share its epoch, and two workers may be given
// the same epoch.
func MsgID(model, worker string, rank uint32, epoch, firstID uint64) string {
	return msgIDPrefix(model, worker, rank, epoch) + strconv.FormatUint(firstID, 10)
}

func msgIDPrefix(model, worker string, rank uint32, epoch uint64) string {
	return escape.SubjectToken.Escape(model) + "." + escape.SubjectToken.Escape(worker) + "." +
		strconv.FormatUint(uint64(rank), 10) + "." + strconv.FormatUint(epoch, 10) + "."
}

// publish sends one batch until the stream acknowledges it; it returns
// false only when ctx ends first.
func (p *Publisher) publish(ctx context.Context, data []byte, firstID uint64, n int) bool {
	msg := &nats.Msg{Subject: p.subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, p.msgID+strconv.FormatUint(firstID, 10))
	backoff := p.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, p.cfg.PublishTimeout)
		ack, err := p.js.PublishMsg(actx, msg)
		cancel()
		if err == nil {
			if ack.Duplicate {
				p.dups.Add(1)
			}
			p.batches.Add(1)
			p.published.Add(uint64(n))
			p.mu.Lock()
			p.acked = firstID + uint64(n) - 1
			close(p.progress)
			p.progress = make(chan struct{})
			p.mu.Unlock()
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		p.pubErrs.Add(1)
		p.log.logf(slog.LevelWarn, "publish", "kvevents: publish failed; retrying the same batch",
			slog.String("subject", p.subject), slog.Uint64("first_event_id", firstID),
			slog.Int("attempt", attempt), slog.String("error", err.Error()))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		backoff = min(2*backoff, p.cfg.RetryMax)
	}
}
