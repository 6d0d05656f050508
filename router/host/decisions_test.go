package host

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/workerref"
)

type testDecision struct {
	key    workerref.Target
	hashes []kvevents.SeqHash
}

func encodeDecisions(replica string, ds []testDecision) []byte {
	buf := appendDecisionHeader(nil, replica)
	for _, d := range ds {
		buf = appendDecision(buf, d.key, d.hashes)
	}
	setDecisionCount(buf, len(replica), len(ds))
	return buf
}

func TestDecisionRoundTrip(t *testing.T) {
	long := make([]kvevents.SeqHash, maxDecisionHashes+5)
	for i := range long {
		long[i] = kvevents.SeqHash(i * 3)
	}
	tests := []struct {
		name string
		ds   []testDecision
		want []testDecision // nil = ds
	}{
		{"none", nil, nil},
		{"one", []testDecision{{workerref.Target{Worker: "w-1", Rank: 0}, []kvevents.SeqHash{1, 2, 3}}}, nil},
		{"several", []testDecision{
			{workerref.Target{Worker: "w-1", Rank: 3}, []kvevents.SeqHash{1 << 63, 2}},
			{workerref.Target{Worker: "ü", Rank: 1<<32 - 1}, []kvevents.SeqHash{}},
			{workerref.Target{Worker: "w-1", Rank: 0}, []kvevents.SeqHash{7}},
		}, nil},
		{"long prompt cut to the bound", []testDecision{{workerref.Target{Worker: "w"}, long}},
			[]testDecision{{workerref.Target{Worker: "w"}, long[:maxDecisionHashes]}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg := encodeDecisions("rep-a", tc.ds)
			var b decisionBatch
			if err := decodeDecisions(msg, &b); err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == nil {
				want = tc.ds
			}
			if string(b.replica) != "rep-a" || len(b.decisions) != len(want) {
				t.Fatalf("replica %q, %d decisions; want rep-a, %d", b.replica, len(b.decisions), len(want))
			}
			for i, d := range b.decisions {
				if d.key != want[i].key || !slices.Equal(b.hashesOf(d), want[i].hashes) {
					t.Fatalf("decision %d: %v %v, want %v %v", i, d.key, b.hashesOf(d), want[i].key, want[i].hashes)
				}
			}
		})
	}
}

// The example of docs/protocol.md.
func TestDecisionDocExample(t *testing.T) {
	msg := encodeDecisions("r1", []testDecision{{workerref.Target{Worker: "w0", Rank: 1}, []kvevents.SeqHash{0x1122334455667788, 0x99}}})
	const want = "4b5652440100020072310100020077300100000002000000887766554433221199000000000000000"
	if got := hex.EncodeToString(msg); got != want[:len(want)-1] {
		t.Fatalf("hex %s, want %s", got, want[:len(want)-1])
	}
}

func TestDecodeDecisionsRejects(t *testing.T) {
	good := encodeDecisions("r1", []testDecision{{workerref.Target{Worker: "w0"}, []kvevents.SeqHash{1, 2}}})
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"bad magic", mut(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"future version", mut(func(b []byte) []byte { b[4] = 2; return b })},
		{"empty replica id", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[6:], 0); return b })},
		{"replica id past the end", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[6:], 60000); return b })},
		{"too many decisions", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[10:], maxDecisionsPerMsg+1); return b })},
		{"count above content", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[10:], 2); return b })},
		{"hash count above content", mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 3); return b })},
		{"hash count above bound", mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 1<<31); return b })},
		{"truncated", good[:len(good)-1]},
		{"trailing byte", append(bytes.Clone(good), 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b decisionBatch
			if err := decodeDecisions(tc.data, &b); !errors.Is(err, ErrBadDecisions) {
				t.Fatalf("decode: %v, want ErrBadDecisions", err)
			}
		})
	}
}

func TestDecodeDecisionsZeroAlloc(t *testing.T) {
	hs := make([]kvevents.SeqHash, 128)
	msg := encodeDecisions("r1", []testDecision{{workerref.Target{Worker: "w0"}, hs}, {workerref.Target{Worker: "w1"}, hs}})
	var b decisionBatch
	if err := decodeDecisions(msg, &b); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = decodeDecisions(msg, &b) }); n != 0 {
		t.Fatalf("%v allocations per decode, want 0", n)
	}
}

// FuzzDecodeDecisions: the decoder never panics, rejects with
// ErrBadDecisions, and what it accepts re-encodes to the same bytes.
func FuzzDecodeDecisions(f *testing.F) {
	f.Add(encodeDecisions("r1", []testDecision{{workerref.Target{Worker: "w0", Rank: 1}, []kvevents.SeqHash{1, 2}}}))
	f.Add(encodeDecisions("replica-b", nil))
	f.Add([]byte("KVRD\x01\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var b decisionBatch
		err := decodeDecisions(data, &b)
		if err != nil {
			if !errors.Is(err, ErrBadDecisions) {
				t.Fatalf("error %v is not ErrBadDecisions", err)
			}
			return
		}
		var ds []testDecision
		for _, d := range b.decisions {
			ds = append(ds, testDecision{d.key, b.hashesOf(d)})
		}
		again := encodeDecisions(string(b.replica), ds)
		// The flags byte is reserved: the decoder ignores it.
		if len(data) > 5 {
			again[5] = data[5]
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-encoded %x, want %x", again, data)
		}
	})
}

// Two replicas: a decision routed through replica A reaches replica B's
// predicted index, so B's lookup sees the overlap before any event and B
// routes the prefix to the same worker.
func TestDecisionsSharedBetweenReplicas(t *testing.T) {
	st := startStack(t, stackOpts{workers: 4, replicas: 2})
	st.waitWorkers(4)
	ctx := ctxT(t)
	a, b := st.replicas[0], st.replicas[1]

	prefix := tokens(42, 512)
	var first api.RouteResponse
	if err := a.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: prefix, ExpectedOutputTokens: 4}, &first); err != nil {
		t.Fatal(err)
	}
	// Nothing ran on the worker, so no Stored event exists: only the
	// shared decision can tell B.
	hashes := kvevents.SeqHashes(nil, prefix, DefaultBlockSize, kvevents.HashSeed)
	want := workerref.Target{Worker: first.Worker, Rank: first.Rank}
	bm := b.models[testModel]
	testutil.Eventually(t, 5*time.Second, func() bool {
		var ov index.Overlaps
		bm.pred.Lookup(hashes, index.LookupOptions{}, &ov)
		return len(ov.Workers) == 1 && ov.Workers[0].Key == want && ov.Workers[0].Blocks == len(hashes)
	}, func() string { return "replica B's predicted index does not hold A's decision" })
	if bm.decApplied.Load() == 0 || a.models[testModel].decApplied.Load() != 0 {
		t.Fatalf("applied: B %d (want > 0), A %d (want 0: own echo)", bm.decApplied.Load(), a.models[testModel].decApplied.Load())
	}
	if err := st.client.Free(ctx, testModel, &first); err != nil {
		t.Fatal(err)
	}
	st.waitWorker(first.Worker, idle)

	var got api.RouteResponse
	req := &api.RouteRequest{Model: testModel, TokenIDs: append(append([]uint32(nil), prefix...), tokens(43, 64)...), ExpectedOutputTokens: 4}
	if err := b.Route(ctx, req, &got); err != nil {
		t.Fatal(err)
	}
	if got.Worker != first.Worker || got.OverlapBlocks != 32 {
		t.Fatalf("B routed to %s with overlap %d, want %s with 32", got.Worker, got.OverlapBlocks, first.Worker)
	}
	if err := st.client.Free(ctx, testModel, &got); err != nil {
		t.Fatal(err)
	}
}
