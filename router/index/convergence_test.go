package index_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// The router's index, fed only by the event stream, ends up equal to the
// simulated engines' own caches after a random workload with evictions,
// a cache reset and a restart (new epoch): the whole event plane, from the
// engine's block cache through the publisher, JetStream and the subscriber
// into the index, loses and invents nothing.
func TestIndexConvergesToEngineCaches(t *testing.T) {
	for _, seqKeyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("seq-keyed=%v", seqKeyed), func(t *testing.T) { testIndexConverges(t, seqKeyed) })
	}
}

// flusher is what the test needs of an engine's emitter: a
// kvevents.Publisher, or sim's sequence-keyed wrapper of one.
type flusher interface {
	Flush(ctx context.Context) error
}

func testIndexConverges(t *testing.T, seqKeyed bool) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := kvevents.EnsureStream(ctx, js, kvevents.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	newPublisher := sim.PublisherFactory(js, kvevents.PublisherConfig{Model: "m", MaxBatchEvents: 4, MaxDelay: time.Millisecond, Logger: quiet, SeqKeyed: seqKeyed})

	var mu sync.Mutex
	live := map[workerref.Target]flusher{} // the current epoch's publisher per (worker, rank)
	var engines []*sim.Engine
	for i := range 3 {
		name := fmt.Sprintf("w%d", i)
		e, err := sim.New(sim.Config{
			Worker: name, Model: "m", Ranks: 2, BlockSize: 16, KVBlocks: 40, MaxBatchedTokens: 128,
			Clock: sim.NewVirtualClock(time.Unix(1_700_000_000, 0)),
			NewEmitter: func(rank uint32, epoch uint64) (sim.EventEmitter, error) {
				em, err := newPublisher(name, rank, epoch)
				if err == nil {
					mu.Lock()
					live[workerref.Target{Worker: name, Rank: rank}] = em.(flusher)
					mu.Unlock()
				}
				return em, err
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := e.Close(context.Background()); err != nil {
				t.Errorf("close engine: %v", err)
			}
		})
		engines = append(engines, e)
	}

	idx := index.New(index.Config{Model: "m"})
	sub, err := kvevents.NewSubscriber(js, kvevents.SubscriberConfig{Sink: idx, Logger: quiet})
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

	converged := func(when string) {
		t.Helper()
		mu.Lock()
		pubs := make([]flusher, 0, len(live))
		for _, p := range live {
			pubs = append(pubs, p)
		}
		mu.Unlock()
		for _, p := range pubs {
			if err := p.Flush(ctx); err != nil {
				t.Fatalf("%s: flush: %v", when, err)
			}
		}
		if err := sub.WaitCaughtUp(ctx); err != nil {
			t.Fatalf("%s: catch up: %v", when, err)
		}
		got := map[workerref.Target][]kvevents.SeqHash{}
		total := 0
		for _, d := range idx.Dump() {
			total += len(d.Blocks)
			for _, b := range d.Blocks {
				got[d.Key] = append(got[d.Key], b.Seq)
			}
		}
		for _, e := range engines {
			for k, want := range e.Dump() {
				have := got[k]
				slices.Sort(have)
				if !slices.Equal(have, want) {
					t.Fatalf("%s: index holds %d blocks for %v, engine %d", when, len(have), k, len(want))
				}
				delete(got, k)
			}
		}
		if total == 0 {
			t.Fatalf("%s: the index is empty: nothing was compared", when)
		}
		for k, extra := range got {
			if len(extra) > 0 {
				t.Fatalf("%s: index holds %d blocks for %v that no engine has", when, len(extra), k)
			}
		}
	}

	rng := rand.New(rand.NewPCG(3, 4))
	system := make([]uint32, 256) // a shared system prompt: many requests reuse its blocks
	for i := range system {
		system[i] = uint32(i + 1)
	}
	work := func(n int) {
		for i := range n {
			e := engines[rng.IntN(len(engines))]
			prompt := slices.Clone(system[:rng.IntN(len(system))])
			for range rng.IntN(100) + 1 {
				prompt = append(prompt, rng.Uint32N(1<<20))
			}
			_, err := e.Submit(ctx, sim.Request{Tokens: prompt, MaxTokens: rng.IntN(24) + 1, Rank: uint32(rng.IntN(2))})
			if err != nil && !errors.Is(err, sim.ErrTooLong) {
				t.Fatal(err)
			}
			if i%5 == 4 {
				for _, e := range engines {
					if err := e.RunUntilIdle(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		for _, e := range engines {
			if err := e.RunUntilIdle(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	work(120)
	converged("after a random workload")
	if err := engines[1].Reset(); err != nil {
		t.Fatal(err)
	}
	work(60)
	converged("after a cache reset")
	if err := engines[2].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	work(60)
	converged("after a restart with a new epoch")

	var removed uint64
	for _, e := range engines {
		for _, st := range e.Stats() {
			removed += st.RemovedBlocks
		}
	}
	if removed == 0 {
		t.Fatal("the workload never evicted: the test would not exercise Removed")
	}
	for _, d := range idx.Dump() {
		if d.SeqKeyed != seqKeyed {
			t.Fatalf("%v indexed with SeqKeyed %v, published with %v", d.Key, d.SeqKeyed, seqKeyed)
		}
	}
}
