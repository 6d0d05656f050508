package index

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// TestRecoveryWithEventPlane runs the whole recovery path with the real
// event plane: kvevents publishers (one per worker and rank) → KVR_EVENTS →
// kvevents subscriber → index. Replica A follows the stream and saves a
// snapshot midway; a worker then restarts (new epoch). Replica B loads the
// snapshot and replays from before its sequence (overlap); the subscriber
// asks B for its cursors, skips what B already reflects and signals the
// restart. B must end identical to A, cursors included, and to the
// reference model.
func TestRecoveryWithEventPlane(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := kvevents.EnsureStream(ctx, js, kvevents.StreamConfig{Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	const model = "llama"
	rng := rand.New(rand.NewPCG(21, 21))
	u := newUniverse(rng, 400, 3)
	keys := []workerref.Target{{Worker: "gpu-a"}, {Worker: "gpu-b"}, {Worker: "gpu-c"}, {Worker: "gpu-c", Rank: 1}}
	g := newGen(rng, u, []string{"gpu-a", "gpu-b", "gpu-c"}, 2)
	ref := newRef()
	pubs := map[workerref.Target]*kvevents.Publisher{}
	newPub := func(k workerref.Target) {
		p, err := kvevents.NewPublisher(js, kvevents.PublisherConfig{Model: model, Worker: k.Worker, Rank: k.Rank, MaxDelay: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		pubs[k] = p
	}
	for _, k := range keys {
		newPub(k)
	}
	defer func() {
		for _, p := range pubs {
			if err := p.Close(context.Background()); err != nil {
				t.Errorf("close publisher %s: %v", p.Subject(), err)
			}
		}
	}()
	emit := func(n int) {
		for i := 0; i < n; i++ {
			k := keys[rng.IntN(len(keys))]
			b := g.batch(k, ref)
			for _, ev := range b.Events {
				if err := pubs[k].Emit(ev); err != nil {
					t.Fatal(err)
				}
			}
			ref.apply(b)
		}
		for _, p := range pubs {
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	lastSeq := func() uint64 {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var subs []*kvevents.Subscriber
	follow := func(x *Index, start uint64) (stop func()) {
		sub, err := kvevents.NewSubscriber(js, kvevents.SubscriberConfig{StartSeq: start, Sink: x})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
		rctx, rcancel := context.WithCancel(ctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sub.Run(rctx); err != nil {
				t.Errorf("subscriber Run: %v", err)
			}
		}()
		return rcancel
	}
	waitFor := func(x *Index, seq uint64) {
		t.Helper()
		testutil.Eventually(t, 15*time.Second, func() bool { return x.StreamSeq() >= seq }, func() string {
			msg := fmt.Sprintf("index at %d, waiting for %d", x.StreamSeq(), seq)
			for _, s := range subs {
				msg += fmt.Sprintf("; subscriber %+v", s.Stats())
			}
			return msg
		})
	}

	a := New(Config{Model: model})
	stopA := follow(a, 0)
	defer stopA()
	emit(600)
	waitFor(a, lastSeq())
	snapSeq, err := SaveSnapshot(ctx, js, "", a)
	if err != nil {
		t.Fatal(err)
	}

	// More traffic, then gpu-b restarts: a new publisher, a new epoch, an
	// empty cache.
	emit(300)
	if err := pubs[keys[1]].Close(ctx); err != nil {
		t.Fatal(err)
	}
	newPub(keys[1])
	ref.clearKey(keys[1])
	emit(300)
	end := lastSeq()
	waitFor(a, end)

	b := New(Config{Model: model})
	got, err := LoadSnapshot(ctx, js, "", b)
	if err != nil || got != snapSeq {
		t.Fatalf("load: %d %v (saved %d)", got, err, snapSeq)
	}
	start := uint64(1) // replay messages B already reflects
	if got > 3 {
		start = got - 3
	}
	stopB := follow(b, start)
	defer stopB()
	waitFor(b, end)

	da, db := a.Dump(), b.Dump()
	if !reflect.DeepEqual(da, db) {
		t.Fatalf("replica dumps differ:\n%v\n%v", da, db)
	}
	dumpsEqual(t, ref.dump(), db)
	if st := subs[1].Stats(); st.Duplicates+st.Trimmed == 0 {
		t.Errorf("replay overlapped nothing: %+v", st)
	}
	if st := b.Stats(); st.Resyncs == 0 {
		t.Errorf("the restart was not signalled: %+v", st)
	}
	checkInvariants(t, b)
	var out Overlaps
	for i := 0; i < 200; i++ {
		compareLookup(t, b, []*refModel{ref}, g.query(), g.options(), &out)
	}
}
