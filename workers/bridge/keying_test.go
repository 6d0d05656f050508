package bridge

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

// A rank's converter and publisher always agree on the keying, whatever
// Config.Events says: sequence-keyed unless EngineKeyed.
func TestRankEventsKeyingAgrees(t *testing.T) {
	for _, engineKeyed := range []bool{false, true} {
		for _, asked := range []bool{false, true} {
			cfg := Config{Model: "m", WorkerID: "w", Prefix: "p", EngineKeyed: engineKeyed,
				Events: kvevents.PublisherConfig{SeqKeyed: asked, Epoch: 9}}
			cc, pc := cfg.rankEvents(16, 3)
			if cc.SeqKeyed != !engineKeyed || pc.SeqKeyed != !engineKeyed {
				t.Errorf("EngineKeyed %v, Events.SeqKeyed %v: converter %v, publisher %v", engineKeyed, asked, cc.SeqKeyed, pc.SeqKeyed)
			}
			if cc.BlockSize != 16 || pc.Rank != 3 || pc.Model != "m" || pc.Worker != "w" || pc.Prefix != "p" || pc.Epoch != 0 {
				t.Errorf("configs %+v, %+v", cc, pc)
			}
		}
	}
}

// After a resync (routers cleared the rank), a block the engine stores
// again is announced again, although a sequence-keyed converter saw it
// stored before: its removal may have been among the lost events.
func TestResyncAnnouncesBlocksAgain(t *testing.T) {
	f := newFleet(t)
	r := testRank(t, f, "w8")
	r.apply(vllmzmq.Message{Seq: 0, Payload: encode(t, []any{1.7e9, []any{stored(1, 100), stored(2, 200)}, 0})})
	testutil.Eventually(t, 5*time.Second, func() bool { return len(f.mirror.seqs(key("w8"))) == 2 },
		func() string { return "the 2 blocks in the index" })
	r.resync(reasonReplayLate)
	testutil.Eventually(t, 5*time.Second, func() bool { return len(f.mirror.seqs(key("w8"))) == 0 },
		func() string { return "the rank cleared" })
	// Block 1's removal was lost; the engine stores it again, then removes
	// block 2 (which routers no longer hold).
	r.apply(vllmzmq.Message{Seq: 5, Payload: encode(t, []any{1.7e9, []any{stored(1, 100), []any{"BlockRemoved", []uint64{2}, "GPU"}}, 0})})
	want := seqsOf([]uint64{1})
	testutil.Eventually(t, 5*time.Second, func() bool {
		got := f.mirror.seqs(key("w8"))
		return len(got) == 1 && got[0] == want[0]
	}, func() string { return "block 1 in the index again" })
	if n := f.mirror.seqKeyed.Load(); n == 0 {
		t.Fatal("the test rank published no sequence-keyed batch")
	}
}
