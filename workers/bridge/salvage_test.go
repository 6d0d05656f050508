package bridge

import (
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

func tokens(base uint32) []uint32 {
	out := make([]uint32, testBlock)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// stored is a positional vLLM BlockStored of one block.
func stored(hash uint64, base uint32) []any {
	return []any{"BlockStored", []uint64{hash}, nil, tokens(base), testBlock, nil, "GPU"}
}

func encode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testRank is a rank publishing to f's stream, fed by hand.
func testRank(t *testing.T, f *fleet, worker string) *rank {
	t.Helper()
	b := &Bridge{cfg: Config{ReplayTimeout: time.Second}, met: newMetrics(false), log: quiet}
	pub, err := kvevents.NewPublisher(f.js, kvevents.PublisherConfig{Model: testModel, Worker: worker, MaxDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(t.Context()) })
	cc := vllm.ConverterConfig{BlockSize: testBlock}
	conv, _ := vllm.NewConverter(cc)
	return &rank{b: b, label: "0", pub: pub, conv: conv, conv0: cc, log: quiet, synced: true}
}

// One event with a type error (block_hashes a string) is skipped and
// counted; the other events of its batch, in both envelope shapes, reach
// the index. A payload that cannot be read at all is counted and resyncs
// the rank (a removal may have been in it).
func TestBadEventKeepsTheRestOfItsBatch(t *testing.T) {
	f := newFleet(t)
	r := testRank(t, f, "w9")
	bad := []any{"BlockStored", "not a list", nil, tokens(0), testBlock, nil, "GPU"}
	for i, payload := range [][]byte{
		encode(t, []any{1.7e9, []any{stored(1, 100), bad, stored(2, 200)}, 0}),
		encode(t, map[string]any{"ts": 1.7e9, "events": []any{stored(3, 300), bad, stored(4, 400)}, "data_parallel_rank": 0}),
	} {
		r.apply(vllmzmq.Message{Seq: uint64(i), Payload: payload})
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return len(f.mirror.seqs(key("w9"))) == 4 },
		func() string { return "the 4 good blocks in the index" })
	if got := counter(r.b, "decode_errors_total"); got != 2 {
		t.Errorf("decode errors %v, want 2", got)
	}
	if got := counter(r.b, "bad_events_total"); got != 2 {
		t.Errorf("bad events %v, want 2", got)
	}
	for _, junk := range [][]byte{{0xc1}, {0x93, 0x01}, encode(t, "a string"), encode(t, []any{1.0})} {
		r.apply(vllmzmq.Message{Seq: 9, Payload: junk})
	}
	if got := counter(r.b, "resyncs_total"); got != 4 {
		t.Errorf("resyncs %v after 4 unreadable payloads, want 4", got)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return len(f.mirror.seqs(key("w9"))) == 0 },
		func() string { return "the rank cleared" })
}

// Whatever the payload, salvage neither panics nor hands on anything but
// single-event batches.
func FuzzSalvage(f *testing.F) {
	f.Add(encode(f, []any{1.7e9, []any{stored(1, 100), []any{"BlockRemoved", []uint64{1}}}, 0}))
	f.Add(encode(f, map[string]any{"ts": 1.0, "events": []any{[]any{"AllBlocksCleared"}}}))
	f.Add([]byte{0x92, 0xcb})
	f.Fuzz(func(t *testing.T, payload []byte) {
		var buf []byte
		var vb vllm.Batch
		salvage(payload, &buf, func(single []byte) bool {
			if vllm.DecodeBatch(single, &vb) != nil {
				return false
			}
			if len(vb.Events) != 1 {
				t.Fatalf("salvaged batch of %d events", len(vb.Events))
			}
			return true
		})
	})
}
