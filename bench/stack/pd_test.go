package stack

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// A two-turn conversation on a 2p2d fleet over the NATS path, its legs
// run as the replay's driver runs them: each route books a prefill worker
// and a decode worker, the prefill leg names the blocks it holds, the
// decode leg pulls them; turn 2 decodes where turn 1 did, whose engine
// holds turn 1's blocks (the router's predicted overlap) and pulls only
// the rest. Every booking is freed at the end.
func TestPDLegsOverNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Budget(t))
	defer cancel()
	pols, err := replay.LookupPolicies([]string{"kvrouter-pd"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := New(ctx, replay.StackConfig{Policy: pols[0], Model: "m", Workers: 4, Fleet: replay.Fleet{Prefill: 2, Decode: 2},
		KVBlocks: 4096, BlockSize: 16, Replicas: 1, Speedup: 100, SessionMode: replay.SessionNone}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close(context.WithoutCancel(ctx)) }()
	roles := map[string]string{}
	resp, err := st.client.Workers(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range resp.Workers {
		roles[w.Worker] = w.Role
	}
	if fmt.Sprint(roles) != "map[w-0:prefill w-1:prefill w-2:decode w-3:decode]" {
		t.Fatalf("roles %v", roles)
	}
	turn1 := make([]uint32, 16*20+5)
	for i := range turn1 {
		turn1[i] = uint32(i + 1)
	}
	turn2 := append(append([]uint32(nil), turn1...), make([]uint32, 16*4)...)
	for i := len(turn1); i < len(turn2); i++ {
		turn2[i] = uint32(100_000 + i)
	}
	decode1 := ""
	for turn, toks := range [][]uint32{turn1, turn2} {
		routed, reply := pdRequest(ctx, t, st, fmt.Sprintf("r%d", turn), toks)
		if roles[routed.Prefill.Worker] != "prefill" || roles[routed.Worker] != "decode" {
			t.Fatalf("turn %d: prefill on %s, decode on %s", turn+1, routed.Prefill.Worker, routed.Worker)
		}
		full := len(toks) / 16
		switch turn {
		case 0:
			decode1 = routed.Worker
			if reply.CachedTokens != 0 || reply.PulledBlocks != full || reply.TransferMs <= 0 {
				t.Fatalf("turn 1 decode: cached %d, pulled %d of %d blocks in %.3f ms", reply.CachedTokens, reply.PulledBlocks, full, reply.TransferMs)
			}
			// The decode engine's stored events reach the index over
			// the stream, after the reply; turn 2 is routed on them.
			waitIndexed(ctx, t, st, decode1, full)
		case 1:
			if routed.Worker != decode1 || routed.Overlap != 20 {
				t.Fatalf("turn 2 decodes on %s (predicted overlap %d), want %s holding turn 1's 20 blocks", routed.Worker, routed.Overlap, decode1)
			}
			if reply.CachedTokens != 20*16 || reply.PulledBlocks != full-20 {
				t.Fatalf("turn 2 decode: cached %d tokens, pulled %d blocks; want 320 held and %d pulled", reply.CachedTokens, reply.PulledBlocks, full-20)
			}
		}
	}
	loads := map[string]replay.LoadSample{}
	testutil.Eventually(t, 10*time.Second, func() bool {
		clear(loads)
		if err := st.router.Loads(ctx, loads); err != nil {
			return false
		}
		for _, l := range loads {
			if l.ActiveRequests != 0 || l.PrefillTokens != 0 {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("bookings left after both turns: %+v", loads) })
}

// waitIndexed waits until the replica's index holds at least n blocks
// of worker w.
func waitIndexed(ctx context.Context, t *testing.T, st *Stack, w string, n int) {
	t.Helper()
	indexed := func() int {
		resp, err := st.client.Workers(ctx, "m")
		if err != nil {
			return -1
		}
		for _, ws := range resp.Workers {
			if ws.Worker == w {
				return ws.IndexedBlocks
			}
		}
		return 0
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return indexed() >= n }, func() string {
		return fmt.Sprintf("the index holds %d blocks of %s, which decoded a %d-block prompt: its KV events never arrived", indexed(), w, n)
	})
}

// pdRequest routes one split request and runs its legs: both bookings
// are held until their leg ends, then freed.
func pdRequest(ctx context.Context, t *testing.T, st *Stack, id string, toks []uint32) (*replay.Routed, *sim.GenerateReply) {
	t.Helper()
	hs := kvevents.SeqHashes(nil, toks, 16, kvevents.SeedFor("", ""))
	bh := make([]uint64, len(hs))
	for i, h := range hs {
		bh[i] = uint64(h)
	}
	routed, err := st.Router().Route(ctx, &replay.RouteRequest{ID: id, Model: "m", BlockHashes: bh, BlockSize: 16,
		InputTokens: len(toks), ExpectedOutput: 4, PD: true})
	if err != nil || routed.Prefill == nil {
		t.Fatalf("%s: route %+v, %v: want a split", id, routed, err)
	}
	loads := map[string]replay.LoadSample{}
	if err := st.router.Loads(ctx, loads); err != nil {
		t.Fatal(err)
	}
	if loads[routed.Prefill.Worker].ActiveRequests != 1 || loads[routed.Worker].ActiveRequests != 1 {
		t.Fatalf("%s: loads %+v: want one booking on %s and one on %s", id, loads, routed.Prefill.Worker, routed.Worker)
	}
	pre, err := st.Generator().Generate(ctx, routed.Prefill.Endpoint, &sim.GenerateRequest{RequestID: id, TokenIDs: toks, MaxTokens: 1, RemoteDecode: true}, func() {})
	if err != nil || pre.RemoteBlocks != len(toks)/16 || pre.OutputTokens != 1 {
		t.Fatalf("%s prefill leg: %+v, %v", id, pre, err)
	}
	if err := st.Router().Free(ctx, routed.Prefill); err != nil {
		t.Fatal(err)
	}
	reply, err := st.Generator().Generate(ctx, routed.Endpoint, &sim.GenerateRequest{RequestID: id, TokenIDs: toks, MaxTokens: 4, RemoteBlocks: pre.RemoteBlocks},
		func() { _ = st.Router().PrefillDone(ctx, routed) })
	if err != nil || reply.OutputTokens != 4 {
		t.Fatalf("%s decode leg: %+v, %v", id, reply, err)
	}
	if err := st.Router().Free(ctx, routed); err != nil {
		t.Fatal(err)
	}
	return routed, reply
}

// The replay's comparison over the NATS path on a few requests: every
// request of the split policies is split and served, the decode side's
// hits come out, and the report has the split section.
func TestPDReplayOverNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Budget(t))
	defer cancel()
	w, _, err := workload.GeneratePart("agent-loop", workload.PartEval, 1)
	if err != nil {
		t.Fatal(err)
	}
	w = w.Select(12, 0, 0)
	rep, err := replay.Run(ctx, replay.Config{Workload: w, NewStack: Factory(Options{}), Fleet: replay.Fleet{Prefill: 2, Decode: 2},
		KVBlocks: 16384, Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Policies {
		t.Logf("%-14s done %d/%d hit %.3f TTFT p50 %.0f p99 %.0f TPOT p50 %.1f pd %+v", p.Policy, p.Done, p.Requests, p.HitRatio, p.TTFT.P50, p.TTFT.P99, p.ITL.P50, p.PD)
		if p.Done != p.Requests {
			t.Errorf("%s: %d of %d served (%v)", p.Policy, p.Done, p.Requests, p.Codes)
		}
		if p.Policy == "kvrouter" {
			continue
		}
		if p.PD == nil || p.PD.Split != p.Done || p.PD.DecodeHit <= 0 || p.PD.TransferBlocks <= 0 {
			t.Errorf("%s: split figures %+v", p.Policy, p.PD)
		}
	}
}
