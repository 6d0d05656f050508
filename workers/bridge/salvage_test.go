package bridge

import (
	"slices"
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
	cc, pc := Config{Model: testModel, WorkerID: worker, Events: kvevents.PublisherConfig{MaxDelay: time.Millisecond}}.rankEvents(testBlock, 0)
	pub, err := kvevents.NewPublisher(f.js, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(t.Context()) })
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
		salvage(payload, &buf, func(single, _ []byte) bool {
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

// An event that does not decode inside an otherwise readable batch, over a
// real ZMQ socket: a removal or a clear among them resyncs the rank at its
// place, so the routers end with no block the engine has dropped (the
// events after it still count); a bad BlockStored only under-counts and
// does not resync. So does an event of a kind the converter does not know.
func TestDroppedRemovalResyncs(t *testing.T) {
	badRemoval := []any{"BlockRemoved", []any{uint64(1), "not a hash"}, "GPU"}
	badClear := map[string]any{"type": "AllBlocksCleared", "medium": 7}
	unknown := []any{"BlockMoved", []uint64{1}, "GPU"}
	for _, tc := range []struct {
		name  string
		bad   any
		held  []uint64 // what the engine holds after the second batch
		cause string   // the resync reason
		bads  float64  // bad events counted once the third batch is handled
	}{
		{"removal", badRemoval, []uint64{2, 3, 4, 5}, "undecodable_event", 2},
		{"clear", badClear, []uint64{5}, "undecodable_event", 2},
		{"unknown kind", unknown, []uint64{2, 3, 4, 5}, "unknown_event", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			be := newBenchEngine(t, f, "w9")
			t.Cleanup(be.stop)
			// settled polls cond, publishing an empty batch each time: a
			// batch the SUB missed is then a gap, and replayed.
			settled := func(cond func() bool, what string) {
				testutil.Eventually(t, 5*time.Second, func() bool {
					be.zpub.Publish(encode(t, []any{1.7e9, []any{}, 0}))
					return cond()
				}, func() string { return what })
			}
			be.zpub.Publish(encode(t, []any{1.7e9, []any{stored(1, 100), stored(2, 200), stored(3, 300)}, 0}))
			settled(func() bool { return len(f.mirror.seqs(key("w9"))) == 3 }, "the 3 stored blocks in the index")
			be.zpub.Publish(encode(t, []any{1.7e9, []any{stored(4, 400), tc.bad, stored(5, 500)}, 0}))
			want := seqsOf(tc.held)
			last := seqsOf([]uint64{5})[0]
			settled(func() bool {
				_, ok := slices.BinarySearch(f.mirror.seqs(key("w9")), last)
				return ok
			}, "block 5, stored after the bad event, in the index")
			// Events are published in order: the resync, if any, came first.
			if got := f.mirror.seqs(key("w9")); extra(got, want) != 0 {
				t.Fatalf("index holds %d blocks the engine dropped: %v, engine holds %v", extra(got, want), got, want)
			}
			be.zpub.Publish(encode(t, []any{1.7e9, []any{[]any{"BlockStored", "bad"}}, 0}))
			settled(func() bool { return counter(be.r.b, "bad_events_total") == tc.bads }, "the bad BlockStored counted")
			if got := resyncs(be.r.b, tc.cause); got != 1 {
				t.Errorf("resyncs{reason=%s} %v, want 1 (none for the bad BlockStored)", tc.cause, got)
			}
		})
	}
}

// seqsOf returns the sorted sequence hashes of stored(h, 100*h) blocks.
func seqsOf(hs []uint64) []kvevents.SeqHash {
	out := make([]kvevents.SeqHash, 0, len(hs))
	for _, h := range hs {
		out = append(out, kvevents.SeqHashes(nil, tokens(uint32(100*h)), testBlock, kvevents.SeedFor("", ""))...)
	}
	slices.Sort(out)
	return out
}

// resyncs returns kvr_bridge_resyncs_total{reason}.
func resyncs(b *Bridge, reason string) float64 {
	fams, _ := b.met.reg.Gather()
	total := 0.0
	for _, f := range fams {
		if f.GetName() != "kvr_bridge_resyncs_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
