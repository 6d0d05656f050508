package kvevents

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// recSink records what a Subscriber hands it, copying every batch.
type recSink struct {
	mu      sync.Mutex
	seqs    []uint64
	batches []Batch
	signals []Signal
	order   []string // "apply" / "resync:<kind>" in call order
	cursors map[workerref.Target]Cursor
}

func (r *recSink) ApplyBatch(seq uint64, b *Batch) {
	cp := *b
	cp.Events = make([]Event, len(b.Events))
	for i, e := range b.Events {
		e.Blocks = append([]StoredBlock(nil), e.Blocks...)
		e.Removed = append([]EngineHash(nil), e.Removed...)
		e.RemovedSeqs = append([]SeqHash(nil), e.RemovedSeqs...)
		cp.Events[i] = e
	}
	r.mu.Lock()
	r.seqs = append(r.seqs, seq)
	r.batches = append(r.batches, cp)
	r.order = append(r.order, "apply")
	r.mu.Unlock()
}

func (r *recSink) Resync(sig Signal) {
	r.mu.Lock()
	r.signals = append(r.signals, sig)
	r.order = append(r.order, "resync:"+sig.Kind.String())
	r.mu.Unlock()
}

// events returns every applied event with its id.
func (r *recSink) events() (ids []uint64, evs []Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.batches {
		for i, e := range b.Events {
			ids = append(ids, b.FirstEventID+uint64(i))
			evs = append(evs, e)
		}
	}
	return ids, evs
}

func (r *recSink) snapshot() (order []string, signals []Signal, batches []Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.order...), append([]Signal(nil), r.signals...), append([]Batch(nil), r.batches...)
}

// cursorSink is a recSink restored from a snapshot.
type cursorSink struct{ recSink }

func (c *cursorSink) Cursors() map[workerref.Target]Cursor { return c.cursors }

type env struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	ctx context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWithin(t, 30*time.Second)
}

// newEnvWithin is newEnv with a context that ends after within (long for
// benchmarks).
func newEnvWithin(t testing.TB, within time.Duration) *env {
	t.Helper()
	s := natstest.Start(t)
	nc, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	t.Cleanup(cancel)
	if _, err := EnsureStream(ctx, js, StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	return &env{nc: nc, js: js, ctx: ctx}
}

// startSub runs a subscriber until the test ends and waits for Run to return.
func (e *env) startSub(t *testing.T, cfg SubscriberConfig) *Subscriber {
	t.Helper()
	sub, err := NewSubscriber(e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return sub
}

// publishRaw stores one encoded batch on its subject, as a misbehaving or
// foreign publisher would.
func (e *env) publishRaw(t *testing.T, subject string, data []byte, msgID string) *jetstream.PubAck {
	t.Helper()
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	ack, err := e.js.Publish(e.ctx, subject, data, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

func (e *env) publishBatch(t *testing.T, b *Batch) {
	t.Helper()
	data, err := AppendBatch(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	e.publishRaw(t, EventSubject("", b.Model, b.Worker), data, "")
}

func rawBatch(worker string, epoch, first uint64, n int) *Batch {
	b := &Batch{Model: "m", Worker: worker, Epoch: epoch, FirstEventID: first}
	for i := 0; i < n; i++ {
		id := first + uint64(i)
		b.Events = append(b.Events, Event{Kind: KindStored, Blocks: []StoredBlock{{Engine: EngineHash(id), Seq: SeqHash(id * 10)}}})
	}
	return b
}

func waitCaughtUp(t *testing.T, sub *Subscriber) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sub.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestPublishSubscribeEndToEnd(t *testing.T) {
	e := newEnv(t)
	pub, err := NewPublisher(e.js, PublisherConfig{Model: "llama/3.1", Worker: "w.1", Rank: 2, MaxBatchEvents: 7})
	if err != nil {
		t.Fatal(err)
	}
	var want []Event
	blocks := []StoredBlock{{1, 10}, {2, 20}}
	removed := []EngineHash{1}
	for i := 0; i < 50; i++ {
		var ev Event
		switch i % 5 {
		case 4:
			ev = Event{Kind: KindRemoved, Tier: TierHost, Removed: removed}
		case 3:
			ev = Event{Kind: KindCleared}
		default:
			ev = Event{Kind: KindStored, Blocks: blocks}
			if i%2 == 0 {
				ev.Parent, ev.HasParent = EngineHash(i), true
			}
		}
		if err := pub.Emit(ev); err != nil {
			t.Fatal(err)
		}
		want = append(want, ev)
		blocks[0].Seq++ // the publisher must have copied the slices
		removed[0]++
	}
	// Undo the mutation in want: compare against what was emitted.
	for i := range want {
		if want[i].Kind == KindStored {
			want[i].Blocks = []StoredBlock{{1, SeqHash(10 + i)}, {2, 20}}
		}
		if want[i].Kind == KindRemoved {
			want[i].Removed = []EngineHash{EngineHash(1 + i)}
		}
	}
	if err := pub.Flush(e.ctx); err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	sub := e.startSub(t, SubscriberConfig{Sink: sink})
	waitCaughtUp(t, sub)
	ids, got := sink.events()
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d", len(got), len(want))
	}
	for i := range want {
		if ids[i] != uint64(i+1) {
			t.Fatalf("event %d has id %d", i, ids[i])
		}
		if !batchEqual(&Batch{Events: got[i : i+1]}, &Batch{Events: want[i : i+1]}) {
			t.Fatalf("event %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	_, signals, batches := sink.snapshot()
	if len(signals) != 0 {
		t.Fatalf("unexpected signals %+v", signals)
	}
	for _, b := range batches {
		if b.Model != "llama/3.1" || b.Worker != "w.1" || b.Rank != 2 || b.Epoch != pub.Epoch() || len(b.Events) > 7 {
			t.Fatalf("batch header %+v", b)
		}
	}
	if err := pub.Close(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := pub.Emit(Event{Kind: KindCleared}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Emit after Close: %v", err)
	}
	st := pub.Stats()
	if st.Emitted != 50 || st.Published != 50 || st.Unacked != 0 || st.Batches < 8 {
		t.Fatalf("publisher stats %+v", st)
	}
	if sub.LastSeq() != st.Batches {
		t.Fatalf("LastSeq %d, batches %d", sub.LastSeq(), st.Batches)
	}
}

// A sequence-keyed publisher's batches arrive as version 2, with the
// resync marker and every event in its keying; it refuses engine hashes.
func TestPublishSubscribeSeqKeyed(t *testing.T) {
	e := newEnv(t)
	pub, err := NewPublisher(e.js, PublisherConfig{Model: "m", Worker: "w", SeqKeyed: true, MaxBatchEvents: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{Kind: KindStored, Tier: TierHost, Blocks: []StoredBlock{{Seq: 10}, {Seq: 11}}},
		{Kind: KindRemoved, RemovedSeqs: []SeqHash{10}},
		{Kind: KindCleared},
	}
	for _, ev := range want {
		if err := pub.Emit(ev); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []Event{
		{Kind: KindStored, Blocks: []StoredBlock{{Engine: 1, Seq: 10}}},
		{Kind: KindStored, HasParent: true, Blocks: []StoredBlock{{Seq: 10}}},
		{Kind: KindRemoved, Removed: []EngineHash{1}},
	} {
		if err := pub.Emit(bad); !errors.Is(err, ErrInvalidBatch) {
			t.Fatalf("Emit(%+v) = %v, want ErrInvalidBatch", bad, err)
		}
	}
	if err := pub.Flush(e.ctx); err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	sub := e.startSub(t, SubscriberConfig{Sink: sink})
	waitCaughtUp(t, sub)
	_, got := sink.events()
	if !batchEqual(&Batch{Events: got}, &Batch{Events: want}) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	_, _, batches := sink.snapshot()
	for _, b := range batches {
		if !b.SeqKeyed {
			t.Fatalf("batch %+v is not sequence-keyed", b)
		}
	}
	if err := pub.Close(e.ctx); err != nil {
		t.Fatal(err)
	}
	// An engine-keyed publisher refuses sequence-hash removals.
	eng, err := NewPublisher(e.js, PublisherConfig{Model: "m", Worker: "v"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(e.ctx)
	if err := eng.Emit(Event{Kind: KindRemoved, RemovedSeqs: []SeqHash{1}}); !errors.Is(err, ErrInvalidBatch) {
		t.Fatalf("engine-keyed Emit of RemovedSeqs: %v, want ErrInvalidBatch", err)
	}
}

func TestStreamDefaults(t *testing.T) {
	e := newEnv(t)
	s, err := e.js.Stream(e.ctx, DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if cfg.Storage != jetstream.FileStorage || cfg.MaxAge != time.Hour || cfg.Duplicates != 2*time.Minute ||
		len(cfg.Subjects) != 1 || cfg.Subjects[0] != "kvr.events.>" {
		t.Fatalf("stream config %+v", cfg)
	}
	// Idempotent, and MaxAge is configurable.
	if _, err := EnsureStream(e.ctx, e.js, StreamConfig{MaxAge: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
}

// lossyJS stores the first publishes but reports them as failed, the way a
// lost ack looks to the publisher.
type lossyJS struct {
	jetstream.JetStream
	fail atomic.Int32
}

func (l *lossyJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := l.JetStream.PublishMsg(ctx, m, opts...)
	if err == nil && l.fail.Add(-1) >= 0 {
		return nil, errors.New("simulated lost ack")
	}
	return ack, err
}

func TestPublisherRetryIsStoredOnce(t *testing.T) {
	e := newEnv(t)
	ljs := &lossyJS{JetStream: e.js}
	ljs.fail.Store(2)
	pub, err := NewPublisher(ljs, PublisherConfig{Model: "m", Worker: "w", RetryMin: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := pub.Emit(Event{Kind: KindCleared}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(e.ctx); err != nil {
		t.Fatal(err)
	}
	st := pub.Stats()
	if st.PublishErrors != 2 || st.Duplicates != 1 || st.Batches != 1 {
		t.Fatalf("stats %+v: want 2 failed attempts (both stored), then one ack flagged duplicate", st)
	}
	s, _ := e.js.Stream(e.ctx, DefaultStream)
	info, err := s.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want the batch stored once", info.State.Msgs)
	}
	// The same id published by hand is a duplicate too.
	data, _ := AppendBatch(nil, rawBatch("w", pub.Epoch(), 1, 3))
	if ack := e.publishRaw(t, pub.Subject(), data, MsgID("m", "w", 0, pub.Epoch(), 1)); !ack.Duplicate {
		t.Fatal("republish with the same Nats-Msg-Id was stored again")
	}
}

func TestSubscriberSignals(t *testing.T) {
	e := newEnv(t)
	sink := &recSink{}
	sub := e.startSub(t, SubscriberConfig{Sink: sink})
	e.publishBatch(t, rawBatch("w", 7, 1, 2))  // first seen: applied, no signal
	e.publishBatch(t, rawBatch("w", 7, 5, 2))  // gap: expected 3
	e.publishBatch(t, rawBatch("w", 7, 5, 2))  // duplicate: skipped
	e.publishBatch(t, rawBatch("w", 7, 6, 3))  // overlap: trimmed to 7..8
	e.publishBatch(t, rawBatch("w", 9, 1, 1))  // restart: new epoch
	e.publishBatch(t, rawBatch("v", 3, 40, 1)) // another worker, first seen mid-stream
	waitCaughtUp(t, sub)
	order, signals, batches := sink.snapshot()
	wantOrder := []string{"apply", "resync:gap", "apply", "apply", "resync:new-epoch", "apply", "apply"}
	if strings.Join(order, ",") != strings.Join(wantOrder, ",") {
		t.Fatalf("calls %v, want %v", order, wantOrder)
	}
	if g := signals[0]; g.Kind != SignalGap || g.ExpectedID != 3 || g.GotID != 5 || g.Worker != "w" || g.StreamSeq != 2 || g.Key() != workerref.Of("w", 0) {
		t.Fatalf("gap signal %+v", g)
	}
	if n := signals[1]; n.Kind != SignalNewEpoch || n.OldEpoch != 7 || n.NewEpoch != 9 || n.GotID != 1 || n.ExpectedID != 9 {
		t.Fatalf("epoch signal %+v", n)
	}
	if tr := batches[2]; tr.FirstEventID != 7 || len(tr.Events) != 2 || tr.Events[0].Blocks[0].Engine != 7 {
		t.Fatalf("trimmed batch %+v", tr)
	}
	st := sub.Stats()
	if st.Gaps != 1 || st.NewEpochs != 1 || st.Duplicates != 1 || st.Trimmed != 1 || st.Batches != 5 || st.Messages != 6 || st.LastSeq != 6 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSubscriberReplayFromSeq(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 5; i++ {
		e.publishBatch(t, rawBatch("w", 7, uint64(1+2*i), 2))
	}
	// A fresh replica restored from a snapshot taken at stream seq 2 (ids up
	// to 4 applied) replays from seq 3.
	sink := &cursorSink{}
	sink.cursors = map[workerref.Target]Cursor{{Worker: "w"}: {Epoch: 7, NextID: 5}}
	// Before Run has read anything (checked on a subscriber that never
	// runs: a running one may already have handled messages).
	idle, err := NewSubscriber(e.js, SubscriberConfig{Sink: &cursorSink{}, StartSeq: 3})
	if err != nil {
		t.Fatal(err)
	}
	if idle.LastSeq() != 2 {
		t.Fatalf("LastSeq before reading = %d, want StartSeq-1", idle.LastSeq())
	}
	sub := e.startSub(t, SubscriberConfig{Sink: sink, StartSeq: 3})
	waitCaughtUp(t, sub)
	order, _, _ := sink.snapshot()
	if strings.Join(order, ",") != "apply,apply,apply" || sink.seqs[0] != 3 || sub.LastSeq() != 5 {
		t.Fatalf("calls %v seqs %v last %d", order, sink.seqs, sub.LastSeq())
	}
	// The same replay against a snapshot of another epoch signals a restart.
	sink2 := &cursorSink{}
	sink2.cursors = map[workerref.Target]Cursor{{Worker: "w"}: {Epoch: 6, NextID: 100}}
	sub2 := e.startSub(t, SubscriberConfig{Sink: sink2, StartSeq: 4})
	waitCaughtUp(t, sub2)
	order, signals, _ := sink2.snapshot()
	if strings.Join(order, ",") != "resync:new-epoch,apply,apply" || signals[0].OldEpoch != 6 || signals[0].StreamSeq != 4 {
		t.Fatalf("calls %v signals %+v", order, signals)
	}
	// StartSeq one past the end: caught up at once.
	sub3 := e.startSub(t, SubscriberConfig{Sink: &recSink{}, StartSeq: 6})
	waitCaughtUp(t, sub3)
	// Further: it would skip messages 6..99 for ever, which is an error,
	// not "caught up".
	sub4 := e.startSub(t, SubscriberConfig{Sink: &recSink{}, StartSeq: 100})
	if err := sub4.WaitCaughtUp(e.ctx); !errors.Is(err, ErrStartBeyondStream) {
		t.Fatalf("WaitCaughtUp with StartSeq 100 on a stream ending at 5: %v, want ErrStartBeyondStream", err)
	}
}

func TestSubscriberSkipsBadInput(t *testing.T) {
	e := newEnv(t)
	logs := &logRecords{}
	sink := &recSink{}
	sub := e.startSub(t, SubscriberConfig{Sink: sink, Logger: slog.New(logs), LogInterval: time.Hour})
	good, _ := AppendBatch(nil, rawBatch("w", 1, 1, 2))
	subj := EventSubject("", "m", "w")
	e.publishRaw(t, subj, []byte("garbage \xc1\xff"), "")
	e.publishRaw(t, subj, good[:len(good)-3], "")
	e.publishRaw(t, subj, bytes.Repeat([]byte{0xdd, 0xff, 0xff, 0xff, 0x7f}, 4), "")
	e.publishRaw(t, EventSubject("", "m", "other"), good, "") // a batch for w on other's subject
	e.publishRaw(t, subj, []byte{}, "")
	e.publishBatch(t, rawBatch("w", 1, 1, 2))
	waitCaughtUp(t, sub)
	ids, _ := sink.events()
	if len(ids) != 2 || ids[0] != 1 {
		t.Fatalf("applied ids %v, want the good batch only", ids)
	}
	st := sub.Stats()
	if st.Bad != 5 || st.Mismatched != 1 || st.Truncated == 0 || st.Malformed == 0 || st.LastSeq != 6 {
		t.Fatalf("stats %+v", st)
	}
	// Rate limited per subject: one line for kvr.events.m.w, one for .other.
	if n := logs.len(); n != 2 {
		t.Fatalf("%d log lines for 5 bad messages on 2 subjects, want 2", n)
	}
}

// gatedJS blocks every publish until open is closed.
type gatedJS struct {
	jetstream.JetStream
	open chan struct{}
}

func (g *gatedJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.JetStream.PublishMsg(ctx, m, opts...)
}

func TestPublisherBufferFull(t *testing.T) {
	e := newEnv(t)
	gjs := &gatedJS{JetStream: e.js, open: make(chan struct{})}
	pub, err := NewPublisher(gjs, PublisherConfig{Model: "m", Worker: "worker-7", BufferEvents: 4, MaxDelay: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if err := pub.Emit(Event{Kind: KindRemoved, Removed: []EngineHash{EngineHash(i + 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	err = pub.Emit(Event{Kind: KindRemoved, Removed: []EngineHash{99}})
	if !errors.Is(err, ErrBufferFull) || !strings.Contains(err.Error(), "worker-7") {
		t.Fatalf("5th Emit: %v, want ErrBufferFull naming the worker", err)
	}
	if st := pub.Stats(); st.Rejected != 1 || st.Unacked != 4 {
		t.Fatalf("stats %+v", st)
	}
	// Flush cannot finish while publishes are stuck; it returns with ctx.
	fctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	if err := pub.Flush(fctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush: %v", err)
	}
	cancel()
	close(gjs.open)
	if err := pub.Flush(e.ctx); err != nil {
		t.Fatal(err)
	}
	// The next accepted event is preceded by a resync marker.
	if err := pub.Emit(Event{Kind: KindRemoved, Removed: []EngineHash{6}}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(e.ctx); err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	sub := e.startSub(t, SubscriberConfig{Sink: sink})
	waitCaughtUp(t, sub)
	ids, evs := sink.events()
	if len(evs) != 6 || evs[4].Kind != KindCleared || evs[5].Removed[0] != 6 || ids[5] != 6 {
		t.Fatalf("events %v %+v: want 4 removals, a Cleared marker, then the 6th", ids, evs)
	}
	if st := pub.Stats(); st.ResyncMarkers != 1 || st.Emitted != 6 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPublisherCloseWhenUnreachable(t *testing.T) {
	e := newEnv(t)
	gjs := &gatedJS{JetStream: e.js, open: make(chan struct{})} // never opens
	pub, err := NewPublisher(gjs, PublisherConfig{Model: "m", Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Emit(Event{Kind: KindCleared}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	defer cancel()
	if err := pub.Close(ctx); err == nil || !strings.Contains(err.Error(), "1 events unacknowledged") {
		t.Fatalf("Close: %v", err)
	}
	if err := pub.Flush(e.ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close: %v", err)
	}
}

func TestPublisherRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	if _, err := NewPublisher(e.js, PublisherConfig{Worker: "w"}); err == nil {
		t.Fatal("NewPublisher without a model succeeded")
	}
	pub, err := NewPublisher(e.js, PublisherConfig{Model: "m", Worker: "w", Epoch: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(e.ctx)
	if pub.Epoch() != 5 {
		t.Fatalf("Epoch %d", pub.Epoch())
	}
	if err := pub.Emit(Event{Kind: 0}); !errors.Is(err, ErrInvalidBatch) {
		t.Fatalf("Emit kind 0: %v", err)
	}
	// An event too large for one message is refused up front.
	huge := Event{Kind: KindRemoved, Removed: make([]EngineHash, 200_000)}
	for i := range huge.Removed {
		huge.Removed[i] = EngineHash(^uint64(i))
	}
	if err := pub.Emit(huge); !errors.Is(err, ErrInvalidBatch) {
		t.Fatalf("Emit of a 1.8 MB event: %v", err)
	}
	if st := pub.Stats(); st.Emitted != 0 {
		t.Fatalf("stats %+v", st)
	}
	p2, _ := NewPublisher(e.js, PublisherConfig{Model: "m", Worker: "w2"})
	defer p2.Close(e.ctx)
	if p2.Epoch() == 0 || p2.Epoch() == pub.Epoch() {
		t.Fatalf("random epoch %d", p2.Epoch())
	}
}

func TestRunTwiceAndWaitWithoutMessages(t *testing.T) {
	e := newEnv(t)
	sub := e.startSub(t, SubscriberConfig{Sink: &recSink{}})
	waitCaughtUp(t, sub) // empty stream
	testutil.Eventually(t, 5*time.Second, sub.running.Load, func() string { return "the first Run never started" })
	if err := sub.Run(context.Background()); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run: %v", err)
	}
	if _, err := NewSubscriber(e.js, SubscriberConfig{}); err == nil {
		t.Fatal("NewSubscriber without a sink succeeded")
	}
}

// Ranks of one worker share its epoch, and two workers may be configured
// with the same epoch: their batches must not deduplicate each other.
func TestPublishersSharingAnEpoch(t *testing.T) {
	e := newEnv(t)
	var pubs []*Publisher
	for _, k := range []workerref.Target{workerref.Of("w", 0), workerref.Of("w", 1), workerref.Of("v", 0)} {
		p, err := NewPublisher(e.js, PublisherConfig{Model: "m", Worker: k.Worker, Rank: k.Rank, Epoch: 77})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Emit(Event{Kind: KindCleared}); err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	for _, p := range pubs {
		if err := p.Close(e.ctx); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Duplicates != 0 {
			t.Fatalf("%s: ack flagged duplicate: %+v", p.Subject(), st)
		}
	}
	sink := &recSink{}
	sub := e.startSub(t, SubscriberConfig{Sink: sink})
	waitCaughtUp(t, sub)
	if _, _, batches := sink.snapshot(); len(batches) != 3 {
		t.Fatalf("%d batches applied, want one per (worker, rank)", len(batches))
	}
}
