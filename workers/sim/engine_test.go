package sim

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

func TestTimingDefaults(t *testing.T) {
	m := DefaultTiming()
	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"prefill 0", m.PrefillMs(0), 0},
		{"prefill 1", m.PrefillMs(1), 4.209989e-7 + 1.518344e-2 + 16.50142},
		{"prefill 8192", m.PrefillMs(8192), 4.209989e-7*8192*8192 + 1.518344e-2*8192 + 16.50142},
		{"decode p=0", m.DecodeMs(0), 5.74},
		{"decode p=0.5", m.DecodeMs(0.5), -25.74*0.25 + 54.01*0.5 + 5.74},
		{"decode p=1", m.DecodeMs(1), -25.74 + 54.01 + 5.74},
		{"decode floor", Timing{DecodeA: -100, DecodeMin: 1}.DecodeMs(1), 1},
		{"step mixed", m.StepMs(100, 3, 0.5), m.PrefillMs(100) + m.DecodeMs(0.5)},
		{"step decode only", m.StepMs(0, 3, 0), 5.74},
		{"step idle", m.StepMs(0, 0, 0.9), 0},
		{"step never negative", Timing{PrefillC: -50}.StepMs(10, 0, 0), 0},
	}
	for _, tt := range tests {
		if math.Abs(tt.got-tt.want) > 1e-9 {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

// A cached prefix lowers TTFT by exactly prefill(N) - prefill(N - cached).
func TestCachedPrefixLowersPrefill(t *testing.T) {
	tests := []struct {
		name       string
		prompt     int // tokens of the second request
		shared     int // tokens it shares with the first
		wantCached int
	}{
		{"half shared", 1000, 512, 512},
		{"unaligned share rounds down to blocks", 1000, 520, 512},
		{"nothing shared", 1000, 0, 0},
		// Whole prompt cached and block aligned: the last block is
		// recomputed, as in vLLM, to get the logits of the last token.
		{"fully cached, aligned", 512, 512, 496},
		{"fully cached, unaligned", 500, 500, 496},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, _, _ := newTestEngine(t, Config{})
			first := seq(1, 1000)
			a := submit(t, e, Request{ID: "a", Tokens: first, MaxTokens: 1})
			runIdle(t, e)
			ra := result(t, a)
			if ra.TTFT != prefillDur(1000) || ra.CachedTokens != 0 {
				t.Fatalf("cold request: ttft %v cached %d, want %v 0", ra.TTFT, ra.CachedTokens, prefillDur(1000))
			}
			prompt := cat(first[:tt.shared], seq(100000, tt.prompt-tt.shared))
			b := submit(t, e, Request{ID: "b", Tokens: prompt, MaxTokens: 1})
			runIdle(t, e)
			rb := result(t, b)
			if rb.CachedTokens != tt.wantCached {
				t.Fatalf("cached tokens %d, want %d", rb.CachedTokens, tt.wantCached)
			}
			want := prefillDur(tt.prompt - tt.wantCached)
			if rb.TTFT != want {
				t.Fatalf("ttft %v, want prefill(%d) = %v", rb.TTFT, tt.prompt-tt.wantCached, want)
			}
			// The saving against a cold prompt of the same length, from the formula.
			m := DefaultTiming()
			saved := m.PrefillMs(tt.prompt) - m.PrefillMs(tt.prompt-tt.wantCached)
			got := float64(prefillDur(tt.prompt)-rb.TTFT) / 1e6
			if math.Abs(got-saved) > 1e-6 {
				t.Fatalf("saved %.6f ms, formula says %.6f ms", got, saved)
			}
		})
	}
}

func TestDecodeTimingAndITL(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{KVBlocks: 100, Watermark: -1})
	st := submit(t, e, Request{ID: "r", Tokens: seq(1, 20), MaxTokens: 3})
	runIdle(t, e)
	res := result(t, st)
	// 20 prompt tokens + 2 fed-back tokens fit in 2 blocks: p = 2/100.
	dec := msToDuration(DefaultTiming().DecodeMs(0.02))
	if res.TTFT != prefillDur(20) {
		t.Errorf("ttft %v, want %v", res.TTFT, prefillDur(20))
	}
	if res.ITL != dec {
		t.Errorf("itl %v, want %v", res.ITL, dec)
	}
	if want := prefillDur(20) + 2*dec; res.E2E != want {
		t.Errorf("e2e %v, want %v", res.E2E, want)
	}
	if res.OutputTokens != 3 || res.FinishReason != FinishLength || res.Err != nil {
		t.Errorf("result %+v", res)
	}
}

func TestOutputTokensAreDeterministic(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{})
	st := submit(t, e, Request{ID: "req-7", Tokens: seq(1, 40), MaxTokens: 5})
	runIdle(t, e)
	var got []uint32
	for {
		ch, err := st.Recv(context.Background())
		if err != nil {
			break
		}
		if ch.Index != len(got) {
			t.Fatalf("chunk index %d, want %d", ch.Index, len(got))
		}
		got = append(got, ch.Tokens...)
	}
	want := make([]uint32, 5)
	for i := range want {
		want[i] = mixToken(outputSeed("req-7"), uint64(i))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want %v", got, want)
	}
}

func TestSpeedupReportsModelTime(t *testing.T) {
	e, _, clk := newTestEngine(t, Config{Speedup: 8})
	st := submit(t, e, Request{ID: "r", Tokens: seq(1, 1000), MaxTokens: 1})
	runIdle(t, e)
	res := result(t, st)
	if d := res.TTFT - prefillDur(1000); d < -time.Microsecond || d > time.Microsecond {
		t.Fatalf("ttft %v, want model time %v", res.TTFT, prefillDur(1000))
	}
	if el := clk.Now().Sub(t0); el > prefillDur(1000)/8+time.Microsecond {
		t.Fatalf("clock advanced %v, want model time / 8", el)
	}
}

func TestEvictionEmitsRemovedLeafFirst(t *testing.T) {
	// 10 blocks, no watermark; each 64-token prompt takes 4 blocks.
	e, rs, _ := newTestEngine(t, Config{KVBlocks: 10, Watermark: -1})
	em := rs.latest(0)
	a := seq(1000, 64)
	submit(t, e, Request{ID: "a", Tokens: a, MaxTokens: 1})
	runIdle(t, e)
	evs := em.take()
	if len(evs) != 1 || evs[0].Kind != kvevents.KindStored || len(evs[0].Blocks) != 4 || evs[0].HasParent {
		t.Fatalf("after a: events %+v, want one Stored of 4 root blocks", evs)
	}
	aBlocks := evs[0].Blocks
	submit(t, e, Request{ID: "b", Tokens: seq(2000, 64), MaxTokens: 1})
	runIdle(t, e)
	em.take()
	// c needs 4 blocks, 2 are free-empty: the 2 oldest cached blocks go,
	// which are a's last two (b's blocks were released later).
	submit(t, e, Request{ID: "c", Tokens: seq(3000, 64), MaxTokens: 1})
	runIdle(t, e)
	evs = em.take()
	if len(evs) != 2 || evs[0].Kind != kvevents.KindRemoved || evs[1].Kind != kvevents.KindStored {
		t.Fatalf("after c: events %+v, want Removed then Stored", evs)
	}
	want := []kvevents.EngineHash{aBlocks[3].Engine, aBlocks[2].Engine}
	if !slices.Equal(evs[0].Removed, want) {
		t.Fatalf("removed %x, want a's tail %x", evs[0].Removed, want)
	}
	if got := e.Stats()[0].RemovedBlocks; got != 2 {
		t.Fatalf("stats removed %d", got)
	}
	// a's first two blocks are still a prefix hit.
	st := submit(t, e, Request{ID: "a2", Tokens: a, MaxTokens: 1})
	runIdle(t, e)
	if got := result(t, st).CachedTokens; got != 32 {
		t.Fatalf("a again: cached %d, want 32", got)
	}
}

func TestStoredEventsLinkParentsAndUseEngineHash(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{Worker: "wx"})
	em := rs.latest(0)
	p := seq(1, 48)
	submit(t, e, Request{ID: "a", Tokens: p[:32], MaxTokens: 1})
	runIdle(t, e)
	submit(t, e, Request{ID: "b", Tokens: cat(p, seq(9, 1)), MaxTokens: 1})
	runIdle(t, e)
	evs := em.take()
	if len(evs) != 2 {
		t.Fatalf("events %+v", evs)
	}
	want := kvevents.SeqHashes(nil, p, 16, kvevents.HashSeed)
	if evs[0].Blocks[0].Seq != want[0] || evs[0].Blocks[1].Seq != want[1] {
		t.Fatalf("first stored %+v, want seqs %x", evs[0].Blocks, want[:2])
	}
	for _, b := range append(evs[0].Blocks, evs[1].Blocks...) {
		if b.Engine != EngineHash("wx", 0, b.Seq) {
			t.Fatalf("engine hash %x for seq %x, want %x", b.Engine, b.Seq, EngineHash("wx", 0, b.Seq))
		}
	}
	if !evs[1].HasParent || evs[1].Parent != evs[0].Blocks[1].Engine || len(evs[1].Blocks) != 1 || evs[1].Blocks[0].Seq != want[2] {
		t.Fatalf("second stored %+v, want block 3 with parent block 2", evs[1])
	}
}

func TestOutputBlocks(t *testing.T) {
	for _, skip := range []bool{false, true} {
		e, rs, _ := newTestEngine(t, Config{SkipOutputBlocks: skip})
		submit(t, e, Request{ID: "r", Tokens: seq(1, 16), MaxTokens: 20})
		runIdle(t, e)
		stored := 0
		for _, ev := range rs.latest(0).all() {
			stored += len(ev.Blocks)
		}
		// 16 prompt + 19 fed-back output tokens = 2 full blocks.
		want := 2
		if skip {
			want = 1
		}
		if stored != want || len(e.Dump()[workerref.Target{Worker: "w1"}]) != want {
			t.Errorf("skip=%v: stored %d blocks, want %d", skip, stored, want)
		}
	}
}

func TestChunkedPrefillRespectsBudget(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{MaxBatchedTokens: 256})
	em := rs.latest(0)
	st := submit(t, e, Request{ID: "r", Tokens: seq(1, 1000), MaxTokens: 1})
	c := e.ranks[0]
	var perStep []int
	for {
		did, err := c.stepOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !did {
			break
		}
		n := 0
		for _, ev := range em.take() {
			n += len(ev.Blocks)
		}
		perStep = append(perStep, n)
	}
	if want := []int{16, 16, 16, 14}; !slices.Equal(perStep, want) {
		t.Fatalf("blocks stored per step %v, want %v", perStep, want)
	}
	want := 3*prefillDur(256) + prefillDur(232)
	if got := result(t, st).TTFT; got != want {
		t.Fatalf("ttft %v, want 3·prefill(256)+prefill(232) = %v", got, want)
	}
	if s := e.Stats()[0]; s.PrefillTokens != 1000 || s.Steps != 4 {
		t.Fatalf("stats %+v", s)
	}
}

// Decodes share the step budget with prefill chunks.
func TestBudgetSharedWithDecodes(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{MaxBatchedTokens: 100})
	c := e.ranks[0]
	submit(t, e, Request{ID: "d1", Tokens: seq(1, 10), MaxTokens: 50})
	submit(t, e, Request{ID: "d2", Tokens: seq(100, 10), MaxTokens: 50})
	ctx := context.Background()
	if _, err := c.stepOnce(ctx); err != nil { // both prefills
		t.Fatal(err)
	}
	submit(t, e, Request{ID: "p", Tokens: seq(1000, 500), MaxTokens: 1})
	for i := 0; i < 3; i++ {
		c.mu.Lock()
		_, gen, ok := c.schedule()
		total := 0
		for _, r := range c.plan {
			total += r.scheduled
		}
		var pChunk int
		for _, r := range c.plan {
			if r.id == "p" {
				pChunk = r.scheduled
			}
		}
		if !ok || total > 100 || pChunk != 98 {
			c.mu.Unlock()
			t.Fatalf("step %d: %d tokens scheduled (p got %d), want 100 with p 98", i, total, pChunk)
		}
		c.complete(gen)
		c.mu.Unlock()
	}
}

func TestMaxSeqsRespected(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{MaxSeqs: 2})
	var sts []*Stream
	for i := 0; i < 5; i++ {
		sts = append(sts, submit(t, e, Request{Tokens: seq(i*1000, 30), MaxTokens: 4}))
	}
	c := e.ranks[0]
	maxRunning := 0
	for {
		did, err := c.stepOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !did {
			break
		}
		l := e.Load()[0]
		maxRunning = max(maxRunning, l.ActiveRequests)
		if l.ActiveRequests > 2 {
			t.Fatalf("%d running, max 2", l.ActiveRequests)
		}
	}
	if maxRunning != 2 {
		t.Fatalf("max running %d, want 2", maxRunning)
	}
	for _, st := range sts {
		if res := result(t, st); res.OutputTokens != 4 {
			t.Fatalf("%s: %d tokens", st.ID(), res.OutputTokens)
		}
	}
}

func TestPreemptionUnderMemoryPressure(t *testing.T) {
	// 3 requests of 32-token prompts growing to 32+40 tokens: 5 blocks each
	// at the end, 15 in all, on a 10-block rank.
	e, rs, _ := newTestEngine(t, Config{KVBlocks: 10, Watermark: -1})
	var sts []*Stream
	for i := 0; i < 3; i++ {
		sts = append(sts, submit(t, e, Request{Tokens: seq(i*1000, 32), MaxTokens: 41}))
	}
	runIdle(t, e)
	for _, st := range sts {
		res := result(t, st)
		if res.Err != nil || res.OutputTokens != 41 {
			t.Fatalf("%s: %+v", st.ID(), res)
		}
	}
	s := e.Stats()[0]
	if s.Preemptions == 0 {
		t.Fatalf("no preemption: %+v", s)
	}
	m := newMirror(t)
	k := workerref.Target{Worker: "w1"}
	m.apply(k, rs.latest(0).all())
	if got, want := m.seqs(k), e.Dump()[k]; !slices.Equal(got, want) {
		t.Fatalf("events say %d blocks, dump %d", len(got), len(want))
	}
	if e.Load()[0].KVUsedBlocks != 0 {
		t.Fatalf("blocks still held: %+v", e.Load()[0])
	}
}

func TestCancel(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	st, err := e.Submit(ctx, Request{ID: "c", Tokens: seq(1, 100), MaxTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	c := e.ranks[0]
	for i := 0; i < 3; i++ {
		if _, err := c.stepOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	// The context's AfterFunc flags the request; the next step ends it.
	for i := 0; ; i++ {
		if _, done := st.Result(); done {
			break
		}
		if i > 1000 {
			t.Fatal("cancelled request never ended")
		}
		time.Sleep(time.Millisecond)
		if _, err := c.stepOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	res, err := st.Wait(context.Background())
	if !errors.Is(err, ErrCancelled) || res.FinishReason != FinishCancelled {
		t.Fatalf("err %v reason %q", err, res.FinishReason)
	}
	if l := e.Load()[0]; l.ActiveRequests != 0 || l.KVUsedBlocks != 0 {
		t.Fatalf("load after cancel %+v", l)
	}
}

func TestSubmitValidation(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{KVBlocks: 10, Ranks: 2})
	submit(t, e, Request{ID: "dup", Tokens: seq(1, 5), MaxTokens: 1})
	tests := []struct {
		name string
		req  Request
		want error
	}{
		{"empty", Request{Tokens: nil, MaxTokens: 1}, ErrEmptyPrompt},
		{"max tokens 0", Request{Tokens: seq(1, 5)}, ErrBadMaxTokens},
		{"too long", Request{Tokens: seq(1, 150), MaxTokens: 20}, ErrTooLong},
		{"bad rank", Request{Tokens: seq(1, 5), MaxTokens: 1, Rank: 2}, ErrBadRank},
		{"duplicate", Request{ID: "dup", Tokens: seq(1, 5), MaxTokens: 1}, ErrDuplicateRequest},
	}
	for _, tt := range tests {
		if _, err := e.Submit(context.Background(), tt.req); !errors.Is(err, tt.want) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.want)
		}
	}
	// Fits exactly: 150 tokens + 9 fed back = 159 tokens = 10 blocks.
	if _, err := e.Submit(context.Background(), Request{Tokens: seq(1, 150), MaxTokens: 10}); err != nil {
		t.Errorf("exact fit: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	bad := []Config{
		{Model: "m"},
		{Worker: "w"},
		{Worker: "w", Model: "m", BlockSize: -1},
		{Worker: "w", Model: "m", KVBlocks: 1},
		{Worker: "w", Model: "m", Watermark: 1},
		{Worker: "w", Model: "m", Watermark: math.NaN()},
		{Worker: "w", Model: "m", Speedup: math.NaN()},
		{Worker: "w", Model: "m", KVBlocks: 1 << 31},
		{Worker: "w", Model: "m", MaxSeqs: -1},
		{Worker: "w", Model: "m", MaxBatchedTokens: -1},
		{Worker: "w", Model: "m", Speedup: -2},
		{Worker: "w", Model: "m", Ranks: -1},
	}
	for _, c := range bad {
		if _, err := New(c); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: err %v, want ErrBadConfig", c, err)
		}
	}
	e, err := New(Config{Worker: "w", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	c := e.Config()
	if c.BlockSize != 16 || c.KVBlocks != 16384 || c.MaxBatchedTokens != 8192 || c.MaxSeqs != 256 || c.Ranks != 1 || c.Prefix != "kvr" {
		t.Fatalf("defaults %+v", c)
	}
	if e.Endpoint() != "kvr.worker.m.w.generate" {
		t.Fatalf("endpoint %q", e.Endpoint())
	}
}

func TestRestartNewEpochAndCleared(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{Ranks: 2})
	submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 1})
	submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 1, Rank: 1})
	runIdle(t, e)
	inflight := submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 5})
	old0, epoch := rs.latest(0), e.Epoch()
	if err := e.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e.Epoch() == epoch {
		t.Fatal("epoch unchanged")
	}
	if _, err := inflight.Wait(context.Background()); !errors.Is(err, ErrRestarted) {
		t.Fatalf("in-flight request: %v, want ErrRestarted", err)
	}
	if !old0.closed {
		t.Fatal("old emitter not closed")
	}
	for rank := uint32(0); rank < 2; rank++ {
		em := rs.latest(rank)
		if em == old0 || em.epoch != e.Epoch() {
			t.Fatalf("rank %d: no new emitter for epoch %d", rank, e.Epoch())
		}
		evs := em.all()
		if len(evs) != 1 || evs[0].Kind != kvevents.KindCleared {
			t.Fatalf("rank %d: new epoch events %+v, want [Cleared]", rank, evs)
		}
	}
	for k, hs := range e.Dump() {
		if len(hs) != 0 {
			t.Fatalf("%v: %d blocks after restart", k, len(hs))
		}
	}
	// The engine still works, cold.
	st := submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 1})
	runIdle(t, e)
	if res := result(t, st); res.CachedTokens != 0 || res.Err != nil {
		t.Fatalf("after restart %+v", res)
	}
}

func TestResetClearsOrRefusesWhenBusy(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{})
	submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 1})
	if err := e.Reset(); !errors.Is(err, ErrBusy) {
		t.Fatalf("reset while busy: %v", err)
	}
	runIdle(t, e)
	if err := e.Reset(); err != nil {
		t.Fatal(err)
	}
	evs := rs.latest(0).all()
	if last := evs[len(evs)-1]; last.Kind != kvevents.KindCleared {
		t.Fatalf("last event %+v, want Cleared", last)
	}
	if len(e.Dump()[workerref.Target{Worker: "w1"}]) != 0 {
		t.Fatal("blocks after reset")
	}
}

func TestCloseFailsInFlightAndEmitsCleared(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{})
	st := submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 1})
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("in flight: %v", err)
	}
	em := rs.latest(0)
	evs := em.all()
	if len(evs) != 1 || evs[0].Kind != kvevents.KindCleared || !em.closed {
		t.Fatalf("events %+v closed %v", evs, em.closed)
	}
	if _, err := e.Submit(context.Background(), Request{Tokens: seq(1, 5), MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
	if err := e.Restart(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("restart after close: %v", err)
	}
}

func TestEmitErrorsAreCounted(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{})
	boom := errors.New("buffer full")
	rs.latest(0).fail = boom
	st := submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 1})
	runIdle(t, e)
	if res := result(t, st); res.Err != nil {
		t.Fatalf("request failed: %v", res.Err)
	}
	s := e.Stats()[0]
	if s.EmitErrors != 1 || !errors.Is(s.LastEmitError, boom) {
		t.Fatalf("stats %+v", s)
	}
}

func TestLoadReport(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{Model: "llama", Worker: "w9", KVBlocks: 100, MaxBatchedTokens: 64})
	submit(t, e, Request{Tokens: seq(1, 100), MaxTokens: 2})
	submit(t, e, Request{Tokens: seq(500, 40), MaxTokens: 2})
	l := e.Load()[0]
	if l.Model != "llama" || l.Worker != "w9" || l.WaitingRequests != 2 || l.ActiveRequests != 0 || l.PrefillTokens != 140 || l.KVTotalBlocks != 100 || !l.At.Equal(t0) {
		t.Fatalf("before: %+v", l)
	}
	if _, err := e.ranks[0].stepOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Step 1: 64 tokens of the first prompt (4 blocks); the second waits
	// for budget.
	l = e.Load()[0]
	if l.ActiveRequests != 1 || l.WaitingRequests != 1 || l.KVUsedBlocks != 4 || l.PrefillTokens != 36+40 {
		t.Fatalf("after one step: %+v", l)
	}
}

// A queued request whose prefix the engine holds reports only its uncached
// tokens as prefill in flight: the cache hit is looked up at report time.
func TestLoadReportWaitingCountsUncachedOnly(t *testing.T) {
	tests := []struct {
		name   string
		prompt []uint32
		want   int
	}{
		{"prefix cached", cat(seq(1, 64), seq(900, 20)), 20},       // 4 cached blocks
		{"whole prompt cached", seq(1, 64), 16},                    // the last block is recomputed, as vLLM
		{"nothing cached", seq(2000, 50), 50},                      // a different prompt
		{"partial block", cat(seq(1, 40), seq(3000, 10)), 50 - 32}, // 2 whole blocks cached
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, _, _ := newTestEngine(t, Config{KVBlocks: 100, MaxBatchedTokens: 512, MaxSeqs: 1})
			warm := submit(t, e, Request{Tokens: seq(1, 64), MaxTokens: 1})
			runIdle(t, e)
			result(t, warm)
			// MaxSeqs 1: a long-running request keeps the next one queued.
			submit(t, e, Request{Tokens: seq(5000, 16), MaxTokens: 1000})
			if _, err := e.ranks[0].stepOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			submit(t, e, Request{Tokens: tc.prompt, MaxTokens: 1})
			l := e.Load()[0]
			if l.WaitingRequests != 1 || l.ActiveRequests != 1 {
				t.Fatalf("want one waiting, one running: %+v", l)
			}
			if l.PrefillTokens != tc.want {
				t.Fatalf("prefill tokens %d, want %d (uncached part only)", l.PrefillTokens, tc.want)
			}
		})
	}
}

func TestMultiRankDump(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{Ranks: 3})
	for r := uint32(0); r < 3; r++ {
		submit(t, e, Request{Tokens: seq(int(r)*100, 16*int(r+1)), MaxTokens: 1, Rank: r})
	}
	runIdle(t, e)
	d := e.Dump()
	for r := uint32(0); r < 3; r++ {
		k := workerref.Target{Worker: "w1", Rank: r}
		if len(d[k]) != int(r+1) {
			t.Fatalf("%v: %d blocks, want %d", k, len(d[k]), r+1)
		}
		m := newMirror(t)
		m.apply(k, rs.latest(r).all())
		if !slices.Equal(m.seqs(k), d[k]) {
			t.Fatalf("%v: events and dump differ", k)
		}
	}
	if got := e.Keys(); len(got) != 3 || got[2] != (workerref.Target{Worker: "w1", Rank: 2}) {
		t.Fatalf("keys %v", got)
	}
}

// Under a random workload with shared prefixes, evictions, preemptions,
// cancellations, a reset and a restart, the events replayed in order always
// describe exactly the cache the engine dumps.
func TestEventsReplayEqualsDump(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		rng := rand.New(rand.NewPCG(seed, 99))
		e, rs, _ := newTestEngine(t, Config{KVBlocks: 64, MaxBatchedTokens: 128, MaxSeqs: 6, Ranks: 2})
		m := newMirror(t)
		prefixes := [][]uint32{seq(1, 200), seq(5000, 120), seq(9000, 64)}
		check := func() {
			for r := uint32(0); r < 2; r++ {
				k := workerref.Target{Worker: "w1", Rank: r}
				m.apply(k, rs.latest(r).take())
			}
			for _, cr := range e.ranks {
				cr.mu.Lock()
				err := cr.cache.check()
				cr.mu.Unlock()
				if err != nil {
					t.Fatalf("seed %d %v: %v", seed, cr.key, err)
				}
			}
			for k, want := range e.Dump() {
				if got := m.seqs(k); !slices.Equal(got, want) {
					t.Fatalf("seed %d %v: events describe %d blocks, dump has %d", seed, k, len(got), len(want))
				}
			}
		}
		c := []*core{e.ranks[0], e.ranks[1]}
		var cancels []context.CancelFunc
		for round := 0; round < 200; round++ {
			for i := rng.IntN(3); i > 0; i-- {
				p := prefixes[rng.IntN(len(prefixes))]
				tok := cat(p[:rng.IntN(len(p))], seq(rng.IntN(1<<20), rng.IntN(150)+1))
				ctx, cancel := context.WithCancel(context.Background())
				cancels = append(cancels, cancel)
				if _, err := e.Submit(ctx, Request{Tokens: tok, MaxTokens: rng.IntN(40) + 1, Rank: uint32(rng.IntN(2))}); err != nil && !errors.Is(err, ErrTooLong) {
					t.Fatal(err)
				}
			}
			if rng.IntN(10) == 0 && len(cancels) > 0 {
				cancels[rng.IntN(len(cancels))]()
			}
			for _, cr := range c {
				if _, err := cr.stepOnce(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if round == 120 {
				runIdle(t, e)
				if err := e.Reset(); err != nil {
					t.Fatal(err)
				}
			}
			if round == 160 {
				// Apply the old epoch's tail, then restart: the new
				// emitters start with Cleared.
				check()
				if err := e.Restart(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			check()
		}
		runIdle(t, e)
		check()
		s := e.Stats()
		t.Logf("seed %d: rank0 %+v", seed, s[0])
		if s[0].RemovedBlocks+s[1].RemovedBlocks == 0 {
			t.Errorf("seed %d: workload never evicted", seed)
		}
		for _, cancel := range cancels {
			cancel()
		}
	}
}

// Reannounce alone (from an empty view) rebuilds exactly the cache.
func TestReannounce(t *testing.T) {
	e, rs, _ := newTestEngine(t, Config{KVBlocks: 80, MaxBatchedTokens: 100})
	rng := rand.New(rand.NewPCG(7, 7))
	base := seq(1, 300)
	for i := 0; i < 60; i++ {
		tok := cat(base[:rng.IntN(300)], seq(rng.IntN(1<<20), rng.IntN(60)+1))
		submit(t, e, Request{Tokens: tok, MaxTokens: rng.IntN(30) + 1})
		if i%5 == 0 {
			runIdle(t, e)
		}
	}
	runIdle(t, e)
	k := workerref.Target{Worker: "w1"}
	em := rs.latest(0)
	em.take()
	e.Reannounce()
	evs := em.take()
	if len(evs) < 2 || evs[0].Kind != kvevents.KindCleared {
		t.Fatalf("events %d, first %+v", len(evs), evs[0])
	}
	m := newMirror(t)
	m.apply(k, evs)
	want := e.Dump()[k]
	if len(want) < 20 || !slices.Equal(m.seqs(k), want) {
		t.Fatalf("reannounced %d blocks, cache has %d", len(m.seqs(k)), len(want))
	}
	// Chains go out as runs, not one event per block.
	if len(evs)-1 >= len(want) {
		t.Errorf("%d Stored events for %d blocks", len(evs)-1, len(want))
	}
}

// A discrete-event replay: AdvanceTo the arrival, Submit backdated.
func TestAdvanceToDiscreteEvents(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{Ranks: 2})
	ctx := context.Background()
	a := submit(t, e, Request{ID: "a", Tokens: seq(1, 1000), MaxTokens: 1})
	t10 := t0.Add(10 * time.Millisecond)
	if err := e.AdvanceTo(ctx, t10); err != nil {
		t.Fatal(err)
	}
	if got := e.Now(); !got.Equal(t0.Add(prefillDur(1000))) {
		t.Fatalf("clock %v after a step started before t: want the step's end", got.Sub(t0))
	}
	b := submit(t, e, Request{ID: "b", Tokens: seq(5000, 500), MaxTokens: 1, Arrival: t10})
	// Rank 1 is idle: its own clock jumps to the arrival.
	c := submit(t, e, Request{ID: "c", Tokens: seq(9000, 500), MaxTokens: 1, Rank: 1, Arrival: t10})
	if err := e.AdvanceTo(ctx, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := result(t, a).TTFT; got != prefillDur(1000) {
		t.Fatalf("a: ttft %v", got)
	}
	if got, want := result(t, b).TTFT, prefillDur(1000)-10*time.Millisecond+prefillDur(500); got != want {
		t.Fatalf("b: ttft %v, want the wait for a's step plus its own prefill %v", got, want)
	}
	if got := result(t, c).TTFT; got != prefillDur(500) {
		t.Fatalf("c on idle rank 1: ttft %v, want %v", got, prefillDur(500))
	}
	if !e.Now().Equal(t0.Add(time.Second)) {
		t.Fatalf("idle engine clock %v, want t0+1s", e.Now().Sub(t0))
	}
	if _, err := e.Submit(ctx, Request{Tokens: seq(1, 5), MaxTokens: 1, Arrival: t0.Add(time.Hour)}); !errors.Is(err, ErrFutureArrival) {
		t.Fatalf("future arrival: %v", err)
	}
	wall, err := New(Config{Worker: "w", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer wall.Close(ctx)
	if err := wall.AdvanceTo(ctx, time.Now()); !errors.Is(err, ErrNotVirtual) {
		t.Fatalf("wall clock: %v", err)
	}
}

// Requests admitted into one step share the prompt blocks an earlier one
// computes in that step, as in vLLM v1, which caches a block's hash when it
// schedules it: siblings arriving together compute their shared prefix
// once. Each block is stored (published) once, when the step completes;
// a prefix the step computes only in part is shared as far as it goes.
func TestSameStepSiblingsShareThePrefix(t *testing.T) {
	tests := []struct {
		name       string
		budget     int
		wantCached []int // per sibling
		wantTokens uint64
		wantSteps  uint64
	}{
		// 512 shared + 3 x 40 own tokens fit one step.
		{"one step", 8192, []int{0, 512, 512}, 512 + 3*40, 1},
		// 300 tokens per step: a's prompt takes two steps, and b and c
		// are admitted beside its second chunk: they find the 18 blocks
		// step 1 cached and the 14 step 2 computes.
		{"chunked", 300, []int{0, 512, 512}, 552 + 2*40, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, rs, _ := newTestEngine(t, Config{MaxBatchedTokens: tt.budget})
			prefix := seq(1, 512)
			var sts []*Stream
			for i := range tt.wantCached {
				sts = append(sts, submit(t, e, Request{ID: string(rune('a' + i)), Tokens: cat(prefix, seq(100000*(i+1), 40)), MaxTokens: 1}))
			}
			runIdle(t, e)
			for i, st := range sts {
				if got := result(t, st).CachedTokens; got != tt.wantCached[i] {
					t.Errorf("sibling %d: cached %d, want %d", i, got, tt.wantCached[i])
				}
			}
			s := e.Stats()[0]
			if s.PrefillTokens != tt.wantTokens || s.AdoptedBlocks != 0 {
				t.Errorf("prefill tokens %d adopted %d, want %d 0", s.PrefillTokens, s.AdoptedBlocks, tt.wantTokens)
			}
			if tt.wantSteps != 0 && s.Steps != tt.wantSteps {
				t.Errorf("steps %d, want %d", s.Steps, tt.wantSteps)
			}
			seen := map[kvevents.SeqHash]int{}
			for _, ev := range rs.latest(0).all() {
				for _, b := range ev.Blocks {
					seen[b.Seq]++
				}
			}
			for h, n := range seen {
				if n != 1 {
					t.Fatalf("block %x stored %d times", h, n)
				}
			}
		})
	}
}
