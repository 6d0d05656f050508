package kvevents

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// countSink counts applied blocks and closes done at a target.
type countSink struct {
	blocks atomic.Int64
	target int64
	done   chan struct{}
}

func (c *countSink) ApplyBatch(_ uint64, b *Batch) {
	var n int64
	for i := range b.Events {
		n += int64(len(b.Events[i].Blocks) + len(b.Events[i].Removed))
	}
	if c.blocks.Add(n) >= c.target && c.target > 0 {
		select {
		case <-c.done:
		default:
			close(c.done)
		}
	}
}
func (c *countSink) Resync(Signal) {}

// BenchmarkPublishSubscribe measures publisher -> embedded JetStream server
// -> subscriber -> sink throughput in block events per second (a stored or
// removed block is one block event), with batching. Target: >= 200,000
// blocks/s on 2 cores.
func BenchmarkPublishSubscribe(b *testing.B) {
	for _, bc := range []struct{ blocksPerEvent, maxBatch int }{{16, 0}, {1, 0}, {16, 1}} {
		blocksPerEvent := bc.blocksPerEvent
		name := fmt.Sprintf("blocks_per_event=%d/max_batch=%d", blocksPerEvent, bc.maxBatch)
		if bc.maxBatch == 0 {
			name = fmt.Sprintf("blocks_per_event=%d/max_batch=default", blocksPerEvent)
		}
		b.Run(name, func(b *testing.B) {
			e := newEnvWithin(b, 5*time.Minute)
			js, ctx := e.js, e.ctx
			sink := &countSink{target: int64(b.N * blocksPerEvent), done: make(chan struct{})}
			sub, err := NewSubscriber(js, SubscriberConfig{Sink: sink})
			if err != nil {
				b.Fatal(err)
			}
			sctx, scancel := context.WithCancel(ctx)
			runDone := make(chan struct{})
			go func() {
				defer close(runDone)
				if err := sub.Run(sctx); err != nil {
					b.Errorf("subscriber Run: %v", err)
				}
			}()
			defer func() { scancel(); <-runDone }()

			pub, err := NewPublisher(js, PublisherConfig{Model: "llama", Worker: "w0", MaxBatchEvents: bc.maxBatch})
			if err != nil {
				b.Fatal(err)
			}
			ev := Event{Kind: KindStored, HasParent: true, Parent: 42}
			for j := 0; j < blocksPerEvent; j++ {
				ev.Blocks = append(ev.Blocks, StoredBlock{Engine: EngineHash(0x9e3779b97f4a7c15 * uint64(j+1)), Seq: SeqHash(j)})
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				ev.Parent = EngineHash(i)
				for {
					err := pub.Emit(ev)
					if err == nil {
						break
					}
					if !errors.Is(err, ErrBufferFull) {
						b.Fatal(err)
					}
					time.Sleep(50 * time.Microsecond)
				}
			}
			if err := pub.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			select {
			case <-sink.done:
			case <-ctx.Done():
				b.Fatalf("subscriber saw %d of %d blocks", sink.blocks.Load(), sink.target)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			st := pub.Stats()
			b.ReportMetric(float64(sink.blocks.Load())/elapsed.Seconds(), "blocks/s")
			b.ReportMetric(float64(st.Published)/float64(max(st.Batches, 1)), "events/batch")
			if err := pub.Close(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkJetStreamPublishMode compares the two ways a publisher can store
// a batch on the embedded server: a synchronous PublishMsg per batch (what
// Publisher does: one in flight, trivially ordered, retried in place) and
// PublishAsync with a window of 256 (pipelined; a retry after a failure
// could land behind later batches). Payload: a 16-event x 16-block batch.
func BenchmarkJetStreamPublishMode(b *testing.B) {
	payload, err := AppendBatch(nil, benchBatch(16, 16))
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"sync", "async"} {
		b.Run(mode, func(b *testing.B) {
			e := newEnvWithin(b, 5*time.Minute)
			js, ctx := e.js, e.ctx
			subj := EventSubject("", "m", "w")
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if mode == "sync" {
					if _, err := js.Publish(ctx, subj, payload); err != nil {
						b.Fatal(err)
					}
					continue
				}
				if _, err := js.PublishAsync(subj, payload); err != nil {
					b.Fatal(err)
				}
			}
			if mode == "async" {
				select {
				case <-js.PublishAsyncComplete():
				case <-ctx.Done():
					b.Fatal("async publishes not acknowledged")
				}
			}
			b.ReportMetric(float64(b.N*16*16)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
