package index

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/kvevents"
)

// TestSnapshotRestoreReplayNATS is the recovery path end to end: batches
// go through a JetStream stream; replica A applies them and saves a
// snapshot midway, then keeps applying; replica B loads the newest
// snapshot and replays the stream from a sequence *before* the snapshot's
// (overlapping events it already contains) to the end. B must end
// identical to A, and to the reference.
func TestSnapshotRestoreReplayNATS(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDXTEST", Subjects: []string{"idxtest.>"}}); err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(11, 11))
	u := newUniverse(rng, 500, 4)
	g := newGen(rng, u, workerNames("gpu", 8), 2)
	g.model = "llama"
	ref := newRef()
	const total = 1500
	for n := 0; n < total; {
		o := g.op(ref)
		if o.kind != opBatch {
			continue // only events travel on the stream
		}
		o.applyRef(ref)
		data, err := json.Marshal(o.batch)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "idxtest."+o.batch.Worker, data); err != nil {
			t.Fatal(err)
		}
		n++
	}

	a := New(Config{Model: "llama"})
	consume(t, ctx, js, 1, 900, a)
	seq, err := SaveSnapshot(ctx, js, "", a)
	if err != nil {
		t.Fatal(err)
	}
	if seq != 900 {
		t.Fatalf("snapshot covers %d, want 900", seq)
	}
	consume(t, ctx, js, 901, total, a)

	b := New(Config{Model: "llama"})
	got, err := LoadSnapshot(ctx, js, "", b)
	if err != nil {
		t.Fatal(err)
	}
	if got != 900 || b.StreamSeq() != 900 {
		t.Fatalf("loaded seq %d, index seq %d", got, b.StreamSeq())
	}
	consume(t, ctx, js, got+1-250, total, b) // 250 events it already has
	dumpsEqual(t, a.Dump(), b.Dump())
	dumpsEqual(t, ref.dump(), b.Dump())
	checkInvariants(t, b)
	var out Overlaps
	for i := 0; i < 200; i++ {
		compareLookup(t, b, []*refModel{ref}, g.query(), g.options(), &out)
	}

	// Newer wins: A saves at 1500; an older replica cannot overwrite it.
	if seq, err := SaveSnapshot(ctx, js, "", a); err != nil || seq != total {
		t.Fatalf("second save: %d %v", seq, err)
	}
	old := New(Config{Model: "llama"})
	consume(t, ctx, js, 1, 400, old)
	if _, err := SaveSnapshot(ctx, js, "", old); !errors.Is(err, ErrStaleSnapshot) {
		t.Fatalf("older save: %v", err)
	}
	if _, err := SaveSnapshot(ctx, js, "", a); !errors.Is(err, ErrStaleSnapshot) {
		t.Fatalf("same-sequence save: %v", err)
	}
	c := New(Config{Model: "llama"})
	if got, err := LoadSnapshot(ctx, js, "", c); err != nil || got != total {
		t.Fatalf("load after stale save: %d %v", got, err)
	}
	dumpsEqual(t, a.Dump(), c.Dump())
}

// consume applies stream messages from..to (inclusive) to x in order.
func consume(t *testing.T, ctx context.Context, js jetstream.JetStream, from, to uint64, x *Index) {
	t.Helper()
	cons, err := js.OrderedConsumer(ctx, "IDXTEST", jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from,
	})
	if err != nil {
		t.Fatal(err)
	}
	for seq := from; seq <= to; {
		batch, err := cons.Fetch(int(min(256, to-seq+1)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			var b kvevents.Batch
			if err := json.Unmarshal(m.Data(), &b); err != nil {
				t.Fatal(err)
			}
			x.ApplyBatch(md.Sequence.Stream, &b)
			seq = md.Sequence.Stream + 1
		}
		if batch.Error() != nil {
			t.Fatal(batch.Error())
		}
	}
}

func TestSnapshotStoreVersions(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := SnapshotStore{JS: js, Bucket: "snaps", Keep: 2}

	if _, err := store.Load(ctx, New(Config{Model: "m"})); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("load from a missing bucket: %v", err)
	}
	if _, err := store.Save(ctx, New(Config{})); !errors.Is(err, ErrNoModel) {
		t.Fatalf("save without model: %v", err)
	}
	if _, ok, err := store.Newest(ctx, "m"); ok || err != nil {
		t.Fatalf("newest in a missing bucket: %v %v", ok, err)
	}

	// Replicas racing to save different sequences: the newest survives,
	// older ones are refused or pruned, at most Keep versions remain.
	mk := func(seq uint64) *Index {
		x := New(Config{Model: "m"})
		x.ApplyBatch(seq, &kvevents.Batch{Model: "m", Worker: "w", Events: []kvevents.Event{{
			Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: kvevents.EngineHash(seq), Seq: kvevents.SeqHash(seq)}},
		}}})
		return x
	}
	var wg sync.WaitGroup
	for _, seq := range []uint64{10, 30, 20, 50, 40} {
		wg.Add(1)
		go func(seq uint64) {
			defer wg.Done()
			if _, err := store.Save(ctx, mk(seq)); err != nil && !errors.Is(err, ErrStaleSnapshot) {
				t.Errorf("save %d: %v", seq, err)
			}
		}(seq)
	}
	wg.Wait()
	if _, err := store.Save(ctx, mk(60)); err != nil {
		t.Fatal(err)
	}
	newest, ok, err := store.Newest(ctx, "m")
	if err != nil || !ok || newest != 60 {
		t.Fatalf("newest %d %v %v", newest, ok, err)
	}
	obs, err := js.ObjectStore(ctx, "snaps")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := versions(ctx, obs, "m")
	if err != nil || len(vs) > 2 {
		t.Fatalf("versions %v %v", vs, err)
	}
	info, err := obs.GetInfo(ctx, SnapshotObjectName("m", 60))
	if err != nil || info.Metadata[MetaStreamSeq] != "60" || info.Metadata[MetaModel] != "m" || info.Metadata[MetaEntries] != "1" {
		t.Fatalf("metadata %+v %v", info, err)
	}

	// Another model's snapshots are separate, even with a dotted name.
	if _, err := store.Save(ctx, func() *Index { x := New(Config{Model: "m.x"}); x.noteSeq(99); return x }()); err != nil {
		t.Fatal(err)
	}
	if newest, _, _ := store.Newest(ctx, "m"); newest != 60 {
		t.Fatalf("model m sees %d", newest)
	}

	// A corrupt newest version is skipped for the previous one.
	if _, err := obs.PutBytes(ctx, SnapshotObjectName("m", 70), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	y := New(Config{Model: "m"})
	seq, err := store.Load(ctx, y)
	if err != nil || seq != 60 {
		t.Fatalf("load past a corrupt version: %d %v", seq, err)
	}
	if y.StreamSeq() != 60 || len(y.Dump()) != 1 {
		t.Fatalf("restored %d %v", y.StreamSeq(), y.Dump())
	}
	// All versions corrupt: the error says why.
	for _, v := range []uint64{80} {
		if _, err := obs.PutBytes(ctx, SnapshotObjectName("m", v), []byte("KVRI-bad")); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []uint64{60, 50} {
		if err := obs.Delete(ctx, SnapshotObjectName("m", v)); err != nil {
			t.Fatalf("delete snapshot %d: %v", v, err)
		}
	}
	if _, err := store.Load(ctx, New(Config{Model: "m"})); !errors.Is(err, ErrSnapshotCorrupt) {
		t.Fatalf("all corrupt: %v", err)
	}
}

// Verify sees each decoded version before it is restored: a refused one
// is skipped for the next older one, and workers it drops are not
// restored.
func TestSnapshotStoreVerify(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, seq := range []uint64{10, 1 << 40} { // the second one claims a sequence far ahead
		x := New(Config{Model: "m"})
		for _, w := range []string{"live", "gone"} {
			x.ApplyBatch(seq, &kvevents.Batch{Model: "m", Worker: w, Events: []kvevents.Event{{
				Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 1, Seq: 1}},
			}}})
		}
		if _, err := SaveSnapshot(ctx, js, "", x); err != nil {
			t.Fatal(err)
		}
	}
	var seen []uint64
	store := SnapshotStore{JS: js, Verify: func(s *Snapshot) error {
		seen = append(seen, s.StreamSeq)
		if s.StreamSeq > 100 {
			return errors.New("ahead of the stream")
		}
		s.Workers = s.Workers[1:] // sorted by name: "gone" first
		return nil
	}}
	x := New(Config{Model: "m"})
	seq, err := store.Load(ctx, x)
	if err != nil || seq != 10 {
		t.Fatalf("load: %d %v, want the older snapshot at 10", seq, err)
	}
	if len(seen) != 2 || seen[0] != 1<<40 {
		t.Fatalf("verified %v, want the newest first, then 10", seen)
	}
	if ws := x.Workers(); len(ws) != 1 || ws[0].Worker != "live" {
		t.Fatalf("restored workers %v, want only live", ws)
	}
	// Every version refused: ErrSnapshotRejected.
	store.Verify = func(*Snapshot) error { return errors.New("no") }
	if _, err := store.Load(ctx, New(Config{Model: "m"})); !errors.Is(err, ErrSnapshotRejected) {
		t.Fatalf("all refused: %v", err)
	}
}
