package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/escape"
	"github.com/kvrouter/kvrouter/internal/jskv"
	"github.com/kvrouter/kvrouter/workerref"
)

// Sink receives decoded batches from a Subscriber, one call at a time, in
// stream order (so in event-id order per worker and rank).
type Sink interface {
	// ApplyBatch applies a batch read at stream sequence streamSeq. b and
	// everything it points to are only valid during the call: the sink
	// copies what it keeps.
	ApplyBatch(streamSeq uint64, b *Batch)
	// Resync tells the sink that what it holds for sig.Key() can no longer
	// be trusted (events were lost, or the worker restarted): it must drop
	// everything it holds for that (worker, rank). The batch that revealed
	// the problem is delivered by ApplyBatch right after.
	Resync(sig Signal)
}

// SignalKind says why a Resync was sent.
type SignalKind uint8

const (
	// SignalGap: a batch's first event id is above the next expected id, so
	// events in between were lost (expired from the stream, or never
	// stored).
	SignalGap SignalKind = iota + 1
	// SignalNewEpoch: a batch carries a different epoch than the previous
	// batch of the same (worker, rank): the worker process restarted with an
	// empty cache.
	SignalNewEpoch
)

func (k SignalKind) String() string {
	switch k {
	case SignalGap:
		return "gap"
	case SignalNewEpoch:
		return "new-epoch"
	}
	return fmt.Sprintf("signal(%d)", uint8(k))
}

// Signal describes one resync.
type Signal struct {
	Kind     SignalKind
	Model    string
	Worker   string
	Rank     uint32
	OldEpoch uint64 // the epoch the subscriber had for the worker
	NewEpoch uint64 // the epoch of the batch that triggered the signal
	// ExpectedID is the event id the subscriber expected next; GotID is the
	// first event id of the triggering batch.
	ExpectedID, GotID uint64
	StreamSeq         uint64 // stream sequence of the triggering batch
}

// Key returns the (worker, rank) the signal is about.
func (s Signal) Key() workerref.Target { return workerref.Target{Worker: s.Worker, Rank: s.Rank} }

// Cursor is where one (worker, rank) stands in its event sequence.
type Cursor struct {
	Epoch  uint64 // epoch of the last batch applied
	NextID uint64 // id of the next event expected
}

// NextEventID returns the id after the batch's last event: the Cursor.NextID
// a sink should record once it has applied b.
func (b *Batch) NextEventID() uint64 { return b.FirstEventID + uint64(len(b.Events)) }

// CursorSource is implemented by a Sink that was restored from a snapshot
// (and so holds state for workers before the first batch it is handed).
// Run asks it once, before reading, for the position of each (worker, rank)
// it holds; the first batch of such a worker is then checked against that
// cursor like any other, so a restart or a gap between the snapshot and the
// replay is signalled. Without it, the first batch seen for a worker is
// applied without a signal: a subscriber that starts mid-stream has nothing
// stale to drop.
type CursorSource interface {
	Cursors() map[workerref.Target]Cursor
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	Prefix   string // subject prefix; default DefaultPrefix
	Stream   string // default DefaultStream
	StartSeq uint64 // first stream sequence to read; 0 = the whole stream
	Sink     Sink   // required
	Logger   *slog.Logger
	// LogInterval is the minimum time between two log lines about bad input
	// on the same subject (default 10s).
	LogInterval time.Duration
	// MaxLogLines bounds the log lines about bad input per LogInterval over
	// all subjects (default 20), so a flood on many distinct subjects cannot
	// flood the log. Past it, lines are counted, and the next line after the
	// interval is one summary ("kvevents: suppressed log lines about bad
	// input", suppressed=K). Every bad message is still counted in Stats.
	MaxLogLines int
	// MaxIDJump is the widest plausible distance between a batch's first
	// event id and the id its (worker, rank) is expected to send next, in
	// either direction (default DefaultMaxIDJump). A batch beyond it is
	// ignored and counted (SubscriberStats.IDJumps) unless the worker's next
	// batch continues it, which makes the jump real: a resync (SignalGap).
	MaxIDJump uint64
}

// DefaultMaxIDJump is SubscriberConfig.MaxIDJump's default, 2^20 events:
// far more than a replay overlap or a short outage puts between two batches
// (a larger real jump is confirmed by the batch after it),
// far less than the 2^64 a forged id can claim.
const DefaultMaxIDJump = 1 << 20

// SubscriberStats counts what a Subscriber saw.
type SubscriberStats struct {
	Messages   uint64 // messages handled (good and bad)
	Batches    uint64 // batches handed to ApplyBatch
	Events     uint64 // events handed to ApplyBatch
	Duplicates uint64 // batches skipped: every id already seen
	Trimmed    uint64 // batches whose already-seen head was cut off
	Gaps       uint64 // SignalGap sent
	NewEpochs  uint64 // SignalNewEpoch sent
	Bad        uint64 // messages skipped as bad input (sum of the causes below)
	Truncated  uint64
	Malformed  uint64 // includes an unsupported version
	Oversized  uint64
	Mismatched uint64 // batch names a model/worker other than its subject's
	// IDJumps counts batches ignored because their first id was more than
	// MaxIDJump from the expected one. When the worker's next batch
	// continues one, the jump was real: that batch is a resync (counted in
	// Gaps) and applied.
	IDJumps uint64
	LastSeq uint64 // last stream sequence handled
}

var (
	// ErrSubjectMismatch: a batch names a model or worker other than the
	// subject it was published on (a publisher writing for someone else).
	ErrSubjectMismatch = errors.New("kvevents: batch does not match its subject")
	// ErrStartBeyondStream: WaitCaughtUp found StartSeq more than one past
	// the stream's last sequence, so the messages in between would be
	// skipped for ever (a snapshot newer than the stream, say).
	ErrStartBeyondStream = errors.New("kvevents: start sequence beyond the end of the stream")
	// ErrAlreadyRunning: Run was called twice.
	ErrAlreadyRunning = errors.New("kvevents: subscriber already running")
)

// Subscriber reads the event stream with an ordered consumer, decodes each
// batch, tracks each (worker, rank)'s epoch and next event id, and hands
// batches in order to a Sink, sending Resync signals on gaps and epoch
// changes. Duplicates (every id already seen) are skipped; a batch that
// overlaps what was seen is trimmed to its new tail. Bad input is counted,
// logged at most once per subject and MaxLogLines times in all per
// interval, and skipped.
type Subscriber struct {
	js     jetstream.JetStream
	cfg    SubscriberConfig
	filter string
	log    *logLimiter

	// Touched only by the consume callback (one goroutine at a time).
	dec     BatchDecoder
	batch   Batch
	workers map[workerref.Target]*workerPos

	running atomic.Bool
	cons    atomic.Pointer[jetstream.Consumer]
	handled atomic.Uint64

	mu       sync.Mutex
	progress chan struct{} // closed and replaced when handled advances
	waiters  atomic.Int32  // WaitCaughtUp calls in progress; no broadcast without them

	messages, batches, events, dups, trimmed, gaps, epochs atomic.Uint64
	truncated, malformed, oversized, mismatched, jumps     atomic.Uint64
}

// workerPos is where one (worker, rank) stands, plus the batch that last
// jumped implausibly far from it (zero when none): if the worker's next
// batch continues that one, the jump was real.
type workerPos struct {
	Cursor
	jump Cursor
}

// NewSubscriber validates cfg. Call Run to start reading.
func NewSubscriber(js jetstream.JetStream, cfg SubscriberConfig) (*Subscriber, error) {
	if js == nil {
		return nil, errors.New("kvevents: NewSubscriber: nil JetStream")
	}
	if cfg.Sink == nil {
		return nil, errors.New("kvevents: NewSubscriber: nil Sink")
	}
	return newSubscriber(js, cfg), nil
}

// newSubscriber fills defaults and builds the state; tests that drive
// process directly use it without a server.
func newSubscriber(js jetstream.JetStream, cfg SubscriberConfig) *Subscriber {
	if cfg.Stream == "" {
		cfg.Stream = DefaultStream
	}
	if cfg.MaxIDJump == 0 {
		cfg.MaxIDJump = DefaultMaxIDJump
	}
	s := &Subscriber{
		js: js, cfg: cfg,
		filter:   EventSubjectFilter(cfg.Prefix),
		log:      newLogLimiter(cfg.Logger, cfg.LogInterval, cfg.MaxLogLines),
		workers:  make(map[workerref.Target]*workerPos),
		progress: make(chan struct{}),
	}
	if cfg.StartSeq > 0 {
		s.handled.Store(cfg.StartSeq - 1)
	}
	return s
}

// Run reads the stream until ctx is done, then stops the consumer, waits
// for the callback in flight and returns nil. It returns an error only if
// the consumer cannot be created (the stream must exist: EnsureStream).
// Run may be called once.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	s.loadCursors()
	occ := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.filter},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if s.cfg.StartSeq > 0 {
		occ.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		occ.OptStartSeq = s.cfg.StartSeq
	}
	cons, err := s.js.OrderedConsumer(ctx, s.cfg.Stream, occ)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kvevents: ordered consumer on stream %q: %w", s.cfg.Stream, err)
	}
	// Bound what the client buffers ahead of the sink: at most 256 messages
	// and 64 MiB (or twice the max payload, so one message always fits).
	byteLimit := 64 << 20
	if nc := s.js.Conn(); nc != nil {
		byteLimit = max(byteLimit, 2*int(nc.MaxPayload()))
	}
	cc, err := cons.Consume(s.handle,
		jetstream.PullMaxMessagesWithBytesLimit(256, byteLimit),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			s.log.logf(slog.LevelWarn, "consume", "kvevents: event stream consumer error",
				slog.String("stream", s.cfg.Stream), slog.String("error", err.Error()))
		}))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kvevents: consume stream %q: %w", s.cfg.Stream, err)
	}
	s.cons.Store(&cons)
	s.broadcast() // WaitCaughtUp callers may now ask the consumer
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	return nil
}

// loadCursors takes each (worker, rank)'s position from a Sink restored
// from a snapshot (CursorSource).
func (s *Subscriber) loadCursors() {
	if cs, ok := s.cfg.Sink.(CursorSource); ok {
		for k, c := range cs.Cursors() {
			s.workers[k] = &workerPos{Cursor: c}
		}
	}
}

// LastSeq returns the last stream sequence handled (StartSeq-1 before the
// first message).
func (s *Subscriber) LastSeq() uint64 { return s.handled.Load() }

// WaitCaughtUp returns once every message that was in the stream when it
// was called has been handled (applied or skipped), or ctx is done. It
// returns ErrStartBeyondStream at once when StartSeq is more than one past
// the stream's last sequence: such a subscriber would never catch up with
// the messages it skips. It also
// returns when the consumer reports nothing pending and everything delivered
// handled, which covers messages that expired before they were read.
func (s *Subscriber) WaitCaughtUp(ctx context.Context) error {
	// Each look-up bounded and tried again: a fresh cluster electing its
	// meta leader may lose a reply, which must not use up all of ctx.
	st, err := jskv.Call(ctx, func(ctx context.Context) (jetstream.Stream, error) { return s.js.Stream(ctx, s.cfg.Stream) })
	if err != nil {
		return fmt.Errorf("kvevents: wait caught up: stream %q: %w", s.cfg.Stream, err)
	}
	info, err := jskv.Call(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) { return st.Info(ctx) })
	if err != nil {
		return fmt.Errorf("kvevents: wait caught up: stream %q info: %w", s.cfg.Stream, err)
	}
	target := info.State.LastSeq
	if s.cfg.StartSeq > target+1 {
		// The messages up to StartSeq-1 will never be read: whoever chose
		// StartSeq (a snapshot's sequence) is ahead of this stream.
		return fmt.Errorf("%w: start sequence %d, stream %q ends at %d", ErrStartBeyondStream, s.cfg.StartSeq, s.cfg.Stream, target)
	}
	if target == 0 || target < s.cfg.StartSeq {
		return nil
	}
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		ch := s.progress
		s.mu.Unlock()
		if s.handled.Load() >= target {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kvevents: wait caught up at %d of %d: %w", s.handled.Load(), target, ctx.Err())
		case <-ch:
		case <-tick.C:
			if s.drained(ctx) {
				return nil
			}
		}
	}
}

// drained asks the consumer whether it has nothing left to deliver and
// everything delivered has been handled.
func (s *Subscriber) drained(ctx context.Context) bool {
	cp := s.cons.Load()
	if cp == nil {
		return false
	}
	ci, err := (*cp).Info(ctx)
	if err != nil {
		return false
	}
	return ci.NumPending == 0 && ci.Delivered.Stream > 0 && s.handled.Load() >= ci.Delivered.Stream
}

// Stats returns the subscriber's counters.
func (s *Subscriber) Stats() SubscriberStats {
	st := SubscriberStats{
		Messages: s.messages.Load(), Batches: s.batches.Load(), Events: s.events.Load(),
		Duplicates: s.dups.Load(), Trimmed: s.trimmed.Load(), Gaps: s.gaps.Load(), NewEpochs: s.epochs.Load(),
		Truncated: s.truncated.Load(), Malformed: s.malformed.Load(), Oversized: s.oversized.Load(),
		Mismatched: s.mismatched.Load(), IDJumps: s.jumps.Load(), LastSeq: s.handled.Load(),
	}
	st.Bad = st.Truncated + st.Malformed + st.Oversized + st.Mismatched
	return st
}

func (s *Subscriber) broadcast() {
	s.mu.Lock()
	close(s.progress)
	s.progress = make(chan struct{})
	s.mu.Unlock()
}

// handle is the consume callback: one message at a time, in stream order.
func (s *Subscriber) handle(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		s.messages.Add(1)
		s.bad(msg.Subject(), 0, fmt.Errorf("%w: no JetStream metadata: %v", ErrMalformed, err))
		return
	}
	seq := md.Sequence.Stream
	s.process(msg.Subject(), seq, msg.Data())
	s.handled.Store(seq)
	if s.waiters.Load() > 0 {
		s.broadcast()
	}
}

// process decodes and applies one message; it is Run's per-message step,
// separate from handle so it can be tested without a server.
func (s *Subscriber) process(subject string, seq uint64, data []byte) {
	s.messages.Add(1)
	b := &s.batch
	if err := s.dec.Decode(data, b); err != nil {
		s.bad(subject, seq, err)
		return
	}
	if err := checkSubject(s.filter, subject, b); err != nil {
		s.bad(subject, seq, err)
		return
	}
	key := b.Key()
	cur := s.workers[key]
	n := uint64(len(b.Events))
	switch {
	case cur == nil:
		// First batch ever seen for this worker: not a gap. Either the
		// subscriber started mid-stream or the worker is new; with no
		// CursorSource there is nothing stale to drop.
		cur = &workerPos{}
		s.workers[key] = cur
	case b.Epoch != cur.Epoch:
		s.epochs.Add(1)
		s.cfg.Sink.Resync(s.signal(SignalNewEpoch, cur, b, seq))
	case s.implausible(cur.NextID, b.FirstEventID):
		if !s.confirmsJump(cur, b) {
			cur.jump = Cursor{Epoch: b.Epoch, NextID: b.NextEventID()}
			s.jumps.Add(1)
			s.log.logf(slog.LevelWarn, subject, "kvevents: ignoring a batch whose event id jumps implausibly far",
				slog.String("subject", subject), slog.Uint64("stream_seq", seq),
				slog.Uint64("expected_id", cur.NextID), slog.Uint64("got_id", b.FirstEventID))
			return
		}
		// The worker's next batch continued the jump: it was real.
		s.gaps.Add(1)
		s.cfg.Sink.Resync(s.signal(SignalGap, cur, b, seq))
	case b.FirstEventID > cur.NextID:
		s.gaps.Add(1)
		s.cfg.Sink.Resync(s.signal(SignalGap, cur, b, seq))
	case b.FirstEventID+n <= cur.NextID:
		s.dups.Add(1) // a retried publish stored twice, or replay overlap
		return
	case b.FirstEventID < cur.NextID:
		skip := cur.NextID - b.FirstEventID
		b.Events = b.Events[skip:]
		b.FirstEventID = cur.NextID
		s.trimmed.Add(1)
	}
	cur.jump = Cursor{}
	cur.Epoch, cur.NextID = b.Epoch, b.NextEventID()
	s.batches.Add(1)
	s.events.Add(uint64(len(b.Events)))
	s.cfg.Sink.ApplyBatch(seq, b)
}

// signal describes a resync of b's worker, which stood at cur.
func (s *Subscriber) signal(kind SignalKind, cur *workerPos, b *Batch, seq uint64) Signal {
	return Signal{Kind: kind, Model: b.Model, Worker: b.Worker, Rank: b.Rank,
		OldEpoch: cur.Epoch, NewEpoch: b.Epoch, ExpectedID: cur.NextID, GotID: b.FirstEventID, StreamSeq: seq}
}

// implausible reports whether first is more than MaxIDJump from next, in
// either direction. Forward, one forged id near 2^64 would otherwise become
// the baseline and make every real batch after it look like a duplicate;
// backward covers a baseline already pushed ahead (a forged first batch or
// snapshot cursor), so that the worker's real batches can confirm
// themselves.
func (s *Subscriber) implausible(next, first uint64) bool {
	if first >= next {
		return first-next > s.cfg.MaxIDJump
	}
	return next-first > s.cfg.MaxIDJump
}

// confirmsJump reports whether b continues the batch that last jumped away
// from cur: two consecutive batches agreeing on the new position are a real
// jump, which a lone outlier (forged, or a publisher bug) is not.
func (s *Subscriber) confirmsJump(cur *workerPos, b *Batch) bool {
	return cur.jump.NextID != 0 && cur.jump.Epoch == b.Epoch && b.FirstEventID == cur.jump.NextID
}

// checkSubject verifies that the batch's model and worker are the ones its
// subject names, without allocating.
func checkSubject(filter, subject string, b *Batch) error {
	root := filter[:len(filter)-1] // "<prefix>.events."
	rest, ok := strings.CutPrefix(subject, root)
	if ok {
		mt, wt, ok2 := strings.Cut(rest, ".")
		if ok2 && escape.SubjectToken.Matches(mt, b.Model) && escape.SubjectToken.Matches(wt, b.Worker) {
			return nil
		}
	}
	return fmt.Errorf("%w: subject %q, batch model %q worker %q", ErrSubjectMismatch, subject, b.Model, b.Worker)
}

// bad counts and (rate-limited per subject and overall) logs one skipped
// message.
func (s *Subscriber) bad(subject string, seq uint64, err error) {
	switch {
	case errors.Is(err, ErrSubjectMismatch):
		s.mismatched.Add(1)
	case errors.Is(err, ErrTruncated):
		s.truncated.Add(1)
	case errors.Is(err, ErrOversized):
		s.oversized.Add(1)
	default:
		s.malformed.Add(1)
	}
	s.log.logf(slog.LevelWarn, subject, "kvevents: skipping bad event message",
		slog.String("subject", subject), slog.Uint64("stream_seq", seq), slog.String("error", err.Error()))
}
