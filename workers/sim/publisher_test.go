package sim

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// mirrorSink is a kvevents.Sink over a mirror: what a router index does,
// minus the prefix tree.
type mirrorSink struct {
	mu      sync.Mutex
	m       *mirror
	err     error
	resyncs []kvevents.Signal
}

func (s *mirrorSink) ApplyBatch(_ uint64, b *kvevents.Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = s.m.applyErr(b.Key(), b.Events)
	}
}

func (s *mirrorSink) Resync(sig kvevents.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resyncs = append(s.resyncs, sig)
	clear(s.m.blocks[sig.Key()])
}

func (s *mirrorSink) seqs(k workerref.Target) ([]kvevents.SeqHash, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.seqs(k), s.err
}

// Events go through real kvevents Publishers (one per rank and epoch) into
// JetStream and back out through a kvevents.Subscriber; the sink ends up
// equal to Dump after a random workload, a reset and a restart.
func TestEventsThroughPublisherAndSubscriber(t *testing.T) {
	t.Run("one rank", func(t *testing.T) { testThroughPublisher(t, 1) })
	t.Run("two ranks", func(t *testing.T) {
		testThroughPublisher(t, 2)
	})
}

func testThroughPublisher(t *testing.T, ranks int) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kvevents.EnsureStream(ctx, js, kvevents.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	mk := PublisherFactory(js, kvevents.PublisherConfig{Model: "m", MaxDelay: time.Millisecond, Logger: quiet})
	var mu sync.Mutex
	var pubs []*kvevents.Publisher
	e, _, _ := newTestEngine(t, Config{
		Worker: "pw", Ranks: ranks, KVBlocks: 48, MaxBatchedTokens: 96,
		NewEmitter: func(rank uint32, epoch uint64) (EventEmitter, error) {
			em, err := mk("pw", rank, epoch)
			if err == nil {
				mu.Lock()
				pubs = append(pubs, em.(*kvevents.Publisher))
				mu.Unlock()
			}
			return em, err
		},
	})
	if got := pubs[0].Epoch(); got != e.Epoch() {
		t.Fatalf("publisher epoch %d, engine %d", got, e.Epoch())
	}

	sink := &mirrorSink{m: newMirror(t)}
	sub, err := kvevents.NewSubscriber(js, kvevents.SubscriberConfig{Sink: sink, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	subCtx, stopSub := context.WithCancel(ctx)
	subDone := make(chan error, 1)
	go func() { subDone <- sub.Run(subCtx) }()
	defer func() {
		stopSub()
		if err := <-subDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("subscriber: %v", err)
		}
	}()

	converge := func(what string) {
		t.Helper()
		mu.Lock()
		live := slices.Clone(pubs[len(pubs)-ranks:])
		mu.Unlock()
		for _, p := range live {
			if err := p.Flush(ctx); err != nil {
				t.Fatalf("%s: flush: %v", what, err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			same := true
			for k, want := range e.Dump() {
				got, err := sink.seqs(k)
				if err != nil {
					sink.mu.Lock()
					t.Logf("resyncs %+v stats %+v", sink.resyncs, sub.Stats())
					sink.mu.Unlock()
					for _, p := range pubs {
						t.Logf("pub %+v", p.Stats())
					}
					t.Fatalf("%s: %v", what, err)
				}
				same = same && slices.Equal(got, want)
			}
			if same {
				return
			}
			if time.Now().After(deadline) {
				for k, want := range e.Dump() {
					got, _ := sink.seqs(k)
					t.Logf("%v: got %d want %d", k, len(got), len(want))
				}
				sink.mu.Lock()
				t.Logf("resyncs %+v stats %+v", sink.resyncs, sub.Stats())
				sink.mu.Unlock()
				for _, p := range pubs {
					t.Logf("pub %+v", p.Stats())
				}
				t.Logf("engine %+v", e.Stats())
				t.Fatalf("%s: subscriber view never equalled the dump", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	rng := rand.New(rand.NewPCG(11, 12))
	work := func(n int) {
		shared := seq(1, 160)
		for i := 0; i < n; i++ {
			tok := cat(shared[:rng.IntN(160)], seq(rng.IntN(1<<20), rng.IntN(80)+1))
			if _, err := e.Submit(ctx, Request{Tokens: tok, MaxTokens: rng.IntN(20) + 1, Rank: uint32(rng.IntN(ranks))}); err != nil && !errors.Is(err, ErrTooLong) {
				t.Fatal(err)
			}
			if i%4 == 3 {
				runIdle(t, e)
			}
		}
		runIdle(t, e)
	}
	work(80)
	converge("after workload")
	if err := e.Reset(); err != nil {
		t.Fatal(err)
	}
	work(40)
	converge("after reset")
	if err := e.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	work(40)
	converge("after restart")

	sink.mu.Lock()
	defer sink.mu.Unlock()
	newEpochs := 0
	for _, sig := range sink.resyncs {
		if sig.Kind == kvevents.SignalNewEpoch && sig.NewEpoch == e.Epoch() {
			newEpochs++
		}
	}
	if newEpochs != ranks {
		t.Fatalf("resyncs %+v, want a new-epoch signal per rank", sink.resyncs)
	}
	var removed uint64
	for _, st := range e.Stats() {
		removed += st.RemovedBlocks
	}
	if removed == 0 {
		t.Fatal("workload never evicted")
	}
}
