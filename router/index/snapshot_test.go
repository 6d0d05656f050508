package index

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// buildRandom applies n random operations to a fresh index and reference.
func buildRandom(t testing.TB, seed uint64, n int, cfg Config) (*Index, *refModel, *gen) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	u := newUniverse(rng, 600, 4)
	g := newGen(rng, u, workerNames("node-", 12), 2).withSeqKeyed()
	g.model = cfg.Model
	x := New(cfg)
	ref := newRef()
	for i := 0; i < n; i++ {
		o := g.op(ref)
		o.applyIndex(x, uint64(i+1))
		o.applyRef(ref)
	}
	return x, ref, g
}

func dumpsEqual(t testing.TB, a, b []WorkerDump) {
	t.Helper()
	strip := func(ds []WorkerDump) []WorkerDump {
		out := make([]WorkerDump, 0, len(ds))
		for _, d := range ds {
			if len(d.Blocks) == 0 {
				continue // an empty worker answers like an absent one
			}
			d.Cursor = kvevents.Cursor{}
			out = append(out, d)
		}
		return out
	}
	if !reflect.DeepEqual(strip(a), strip(b)) {
		t.Fatalf("dumps differ:\n%v\n%v", strip(a), strip(b))
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	x, ref, g := buildRandom(t, 1, 3000, Config{Model: "m"})
	snap := x.Snapshot()
	if snap.StreamSeq == 0 || snap.StreamSeq != x.StreamSeq() {
		t.Fatalf("stream seq %d, index at %d", snap.StreamSeq, x.StreamSeq())
	}
	data, err := snap.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	dec, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dec, snap) {
		t.Fatal("decoded snapshot differs from the original")
	}
	again, _ := dec.MarshalBinary()
	if !bytes.Equal(again, data) {
		t.Fatal("encoding is not canonical")
	}
	y := New(Config{Model: "m"})
	if err := y.Restore(dec); err != nil {
		t.Fatal(err)
	}
	if y.StreamSeq() != snap.StreamSeq {
		t.Fatalf("restored stream seq %d, snapshot %d", y.StreamSeq(), snap.StreamSeq)
	}
	dumpsEqual(t, x.Dump(), y.Dump())
	dumpsEqual(t, ref.dump(), y.Dump())
	checkInvariants(t, y)
	var out Overlaps
	for i := 0; i < 300; i++ {
		compareLookup(t, y, []*refModel{ref}, g.query(), g.options(), &out)
	}
	if !reflect.DeepEqual(x.Cursors(), y.Cursors()) {
		t.Fatal("cursors differ")
	}
	if err := y.Restore(dec); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("restore into a non-empty index: %v", err)
	}
	if err := New(Config{Model: "other"}).Restore(dec); !errors.Is(err, ErrSnapshotMismatch) {
		t.Fatalf("restore into another model: %v", err)
	}
	if err := New(Config{Model: "m", Tier: kvevents.TierHost}).Restore(dec); !errors.Is(err, ErrSnapshotMismatch) {
		t.Fatalf("restore into another tier: %v", err)
	}
}

// TestReplayIsIdempotent: a snapshot may be behind some workers' states
// (it is taken while batches are applied). Replaying events it already
// reflects must converge to the same index.
func TestReplayIsIdempotent(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	u := newUniverse(rng, 400, 3)
	g := newGen(rng, u, workerNames("r", 10), 2).withSeqKeyed()
	ref := newRef()
	var batches []*kvevents.Batch
	for len(batches) < 2000 {
		o := g.op(ref)
		if o.kind != opBatch {
			continue
		}
		o.applyRef(ref)
		batches = append(batches, o.batch)
	}
	full := New(Config{})
	for i, b := range batches {
		full.ApplyBatch(uint64(i+1), b)
	}
	for _, cut := range []int{0, 1, 500, 1234, 1999} {
		for _, overlap := range []int{0, 1, 37, 400} {
			y := New(Config{})
			for i, b := range batches[:cut] {
				y.ApplyBatch(uint64(i+1), b)
			}
			from := max(0, cut-overlap)
			for i := from; i < len(batches); i++ {
				y.ApplyBatch(uint64(i+1), batches[i])
			}
			dumpsEqual(t, full.Dump(), y.Dump())
			checkInvariants(t, y)
		}
	}
	dumpsEqual(t, ref.dump(), full.Dump())
}

func validSnapshotBytes(t testing.TB) []byte {
	t.Helper()
	x := New(Config{Model: "llama"})
	x.ApplyBatch(42, &kvevents.Batch{Model: "llama", Worker: "a", Epoch: 9, FirstEventID: 3, Events: []kvevents.Event{
		{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 10, Seq: 100}, {Engine: 11, Seq: 101}}},
	}})
	x.ApplyBatch(43, &kvevents.Batch{Model: "llama", Worker: "b", Rank: 1, Events: []kvevents.Event{
		{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 10, Seq: 100}}},
	}})
	data, err := x.Snapshot().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// reseal recomputes the checksum after a test edits the body.
func reseal(b []byte) []byte {
	b = bytes.Clone(b)
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

func TestDecodeSnapshotRejects(t *testing.T) {
	good := validSnapshotBytes(t)
	if _, err := DecodeSnapshot(good); err != nil {
		t.Fatal(err)
	}
	// Layout of good: header 16, model len 1 + "llama" 5, tier 1, count 1,
	// worker "a": len 1, name 1, rank 1, epoch 8, last 8, count 1, 2*16.
	const wOff = 16 + 6 + 1 + 1
	set := func(off int, v ...byte) []byte {
		b := bytes.Clone(good)
		copy(b[off:], v)
		return reseal(b)
	}
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrSnapshotCorrupt},
		{"bad magic", reseal(append([]byte("XXXX"), good[4:]...)), ErrSnapshotCorrupt},
		{"version 3", set(4, 3, 0), ErrSnapshotVersion},
		{"version 2 without a sequence-keyed worker", set(4, 2, 0), ErrSnapshotCorrupt},
		{"flags", set(6, 1), ErrSnapshotCorrupt},
		{"checksum", func() []byte { b := bytes.Clone(good); b[20] ^= 1; return b }(), ErrSnapshotCorrupt},
		{"trailing bytes", reseal(append(bytes.Clone(good[:len(good)-4]), 0, 0, 0, 0, 0)), ErrSnapshotCorrupt},
		{"model too long", set(16, 0xff, 0xff, 0x03), ErrSnapshotCorrupt},
		{"unknown tier", set(22, 9), ErrSnapshotCorrupt},
		{"worker count too big", set(23, 0xff, 0xff, 0xff, 0x0f), ErrSnapshotCorrupt},
		{"empty worker name", set(wOff, 0), ErrSnapshotCorrupt},
		{"block count too big", set(wOff+1+1+1+16, 0x7f), ErrSnapshotCorrupt},
		{"engine order", func() []byte {
			b := bytes.Clone(good)
			off := wOff + 1 + 1 + 1 + 16 + 1
			binary.LittleEndian.PutUint64(b[off+16:], 1) // second engine hash below the first
			return reseal(b)
		}(), ErrSnapshotCorrupt},
		{"worker order", func() []byte {
			b := bytes.Clone(good)
			b[wOff+1] = 'c' // "c" sorts after the next worker "b"
			return reseal(b)
		}(), ErrSnapshotCorrupt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeSnapshot(tc.data); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	// Every truncation fails cleanly.
	for n := 0; n < len(good); n++ {
		if _, err := DecodeSnapshot(good[:n]); err == nil {
			t.Fatalf("truncated to %d bytes decoded", n)
		}
		if _, err := DecodeSnapshot(reseal(append(bytes.Clone(good[:n]), 0, 0, 0, 0))); err == nil && n != len(good)-4 {
			t.Fatalf("truncated to %d bytes and resealed decoded", n)
		}
	}
}

// TestDecodeSnapshotRejectsKeyed covers version 2's own fields: the keying
// byte and a sequence-keyed worker's sequence hashes.
func TestDecodeSnapshotRejectsKeyed(t *testing.T) {
	x := New(Config{Model: "llama"})
	x.ApplyBatch(42, &kvevents.Batch{Model: "llama", Worker: "a", Epoch: 9, FirstEventID: 3, SeqKeyed: true, Events: []kvevents.Event{
		{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Seq: 101}, {Seq: 100}}},
	}})
	x.ApplyBatch(43, &kvevents.Batch{Model: "llama", Worker: "b", Rank: 1, Events: []kvevents.Event{
		{Kind: kvevents.KindStored, Blocks: []kvevents.StoredBlock{{Engine: 10, Seq: 100}}},
	}})
	good, err := x.Snapshot().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	s, err := DecodeSnapshot(good)
	if err != nil {
		t.Fatal(err)
	}
	want := []WorkerDump{
		{Key: workerref.Target{Worker: "a"}, Cursor: kvevents.Cursor{Epoch: 9, NextID: 4}, SeqKeyed: true,
			Blocks: []kvevents.StoredBlock{{Seq: 100}, {Seq: 101}}},
		{Key: workerref.Target{Worker: "b", Rank: 1}, Blocks: []kvevents.StoredBlock{{Engine: 10, Seq: 100}}},
	}
	if binary.LittleEndian.Uint16(good[4:]) != 2 || !reflect.DeepEqual(s.Workers, want) {
		t.Fatalf("version %d, workers %+v", binary.LittleEndian.Uint16(good[4:]), s.Workers)
	}
	// Worker "a": len 1, name 1, rank 1, epoch 8, next id 8, keying 1,
	// count 1, two sequence hashes.
	const keying = 16 + 6 + 1 + 1 + 1 + 1 + 1 + 16
	set := func(off int, v ...byte) []byte {
		b := bytes.Clone(good)
		copy(b[off:], v)
		return reseal(b)
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"unknown keying", set(keying, 2)},
		{"sequence hashes out of order", set(keying+2, 101)},
		{"sequence hashes repeated", set(keying+2+8, 100)},
		{"block count too big", set(keying+1, 0x7f)},
		{"read as engine-keyed", set(keying, 0)},
	} {
		if _, err := DecodeSnapshot(tc.data); !errors.Is(err, ErrSnapshotCorrupt) {
			t.Errorf("%s: got %v, want ErrSnapshotCorrupt", tc.name, err)
		}
	}
	for n := 0; n < len(good); n++ {
		if _, err := DecodeSnapshot(reseal(append(bytes.Clone(good[:n]), 0, 0, 0, 0))); err == nil && n != len(good)-4 {
			t.Fatalf("truncated to %d bytes and resealed decoded", n)
		}
	}
	y := New(Config{Model: "llama"})
	if err := y.Restore(s); err != nil {
		t.Fatal(err)
	}
	dumpsEqual(t, x.Dump(), y.Dump())
	// The restored worker goes on as sequence-keyed: a removal by
	// sequence hash finds its block.
	y.ApplyBatch(44, &kvevents.Batch{Model: "llama", Worker: "a", Epoch: 9, FirstEventID: 4, SeqKeyed: true, Events: []kvevents.Event{
		{Kind: kvevents.KindRemoved, RemovedSeqs: []kvevents.SeqHash{100}},
	}})
	if n := y.WorkerBlocks(workerref.Target{Worker: "a"}); n != 1 || y.Stats().Rekeyed != 0 {
		t.Fatalf("after the removal: %d blocks, %d rekeyed", n, y.Stats().Rekeyed)
	}
	checkInvariants(t, y)
}

func TestMarshalRejectsBadInput(t *testing.T) {
	for _, s := range []*Snapshot{
		{Workers: []WorkerDump{{Key: workerref.Target{}}}},
		{Workers: []WorkerDump{{Key: workerref.Target{Worker: "a"}}, {Key: workerref.Target{Worker: "a"}}}},
		{Workers: []WorkerDump{{Key: workerref.Target{Worker: "a"}, Blocks: []kvevents.StoredBlock{{Engine: 1}, {Engine: 1, Seq: 2}}}}},
		{Workers: []WorkerDump{{Key: workerref.Target{Worker: "a"}, SeqKeyed: true, Blocks: []kvevents.StoredBlock{{Seq: 1}, {Seq: 1}}}}},
		{Workers: []WorkerDump{{Key: workerref.Target{Worker: "a"}, SeqKeyed: true, Blocks: []kvevents.StoredBlock{{Engine: 1, Seq: 1}}}}},
		{Model: string(make([]byte, MaxModelNameLen+1))},
	} {
		if _, err := s.MarshalBinary(); err == nil {
			t.Errorf("marshal of %+v succeeded", s)
		}
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(validSnapshotBytes(f))
	x, _, _ := buildRandom(f, 3, 200, Config{Model: "fz"})
	if data, err := x.Snapshot().MarshalBinary(); err == nil {
		f.Add(data) // version 2: buildRandom's workers are partly sequence-keyed
	}
	f.Add([]byte("KVRI"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeSnapshot(data)
		if err != nil {
			if !errors.Is(err, ErrSnapshotCorrupt) && !errors.Is(err, ErrSnapshotVersion) {
				t.Fatalf("unwrapped error %v", err)
			}
			return
		}
		// A valid snapshot re-encodes to the same bytes and restores.
		again, err := s.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, data) {
			t.Fatal("decode/encode is not the identity")
		}
		y := New(Config{Model: s.Model, Tier: s.Tier, Shards: 4})
		if err := y.Restore(s); err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, y)
	})
}
