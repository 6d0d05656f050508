package sim

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

// The same prompt under another cache salt shares no block (the salt is
// in the hash seed from the first block on), under the same salt it is
// served from the cache, and the engine's hashes are the router's
// (kvevents.SeedFor with the salt).
func TestCacheSaltIsolates(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{})
	prompt := seq(1, 112*DefaultBlockSize+5)
	cached := func(salt string) int {
		st := submit(t, e, Request{Tokens: prompt, MaxTokens: 1, CacheSalt: salt})
		runIdle(t, e)
		return result(t, st).CachedTokens
	}
	if n := cached("tenant-a"); n != 0 {
		t.Fatalf("first request cached %d tokens", n)
	}
	if n := cached("tenant-b"); n != 0 {
		t.Fatalf("another salt was served %d tokens (%d blocks) from the cache", n, n/DefaultBlockSize)
	}
	if n := cached(""); n != 0 {
		t.Fatalf("no salt was served %d tokens from salted blocks", n)
	}
	if n := cached("tenant-a"); n != 112*DefaultBlockSize {
		t.Fatalf("the same salt again cached %d tokens, want %d", n, 112*DefaultBlockSize)
	}
	held := map[kvevents.SeqHash]bool{}
	for _, h := range e.Dump()[e.Keys()[0]] {
		held[h] = true
	}
	for _, salt := range []string{"tenant-a", "tenant-b", ""} {
		for i, h := range kvevents.SeqHashes(nil, prompt, DefaultBlockSize, kvevents.SeedFor("", salt)) {
			if !held[h] {
				t.Fatalf("salt %q: block %d of the router's hashes is not the engine's", salt, i)
			}
		}
	}
}

// With MaxLoRAs 1 and a load time, every switch of adapter is a load that
// the step pays for; the base model needs none; a resident adapter is not
// loaded again; RemoveLoRA makes the next request load it again.
func TestLoRALoadsAreCountedAndPaid(t *testing.T) {
	const load = 2 * time.Second
	e, _, _ := newTestEngine(t, Config{MaxLoRAs: 1, LoRALoadTime: load})
	run := func(lora string, first int) Result {
		st := submit(t, e, Request{Tokens: seq(first, 40), MaxTokens: 1, LoRA: lora})
		runIdle(t, e)
		return result(t, st)
	}
	base := run("", 1000)
	a := run("a", 2000)
	if d := a.TTFT - base.TTFT; d < load-time.Millisecond || d > load+time.Millisecond {
		t.Fatalf("TTFT with a load %v, without %v: want the load's %v more", a.TTFT, base.TTFT, load)
	}
	run("a", 3000)
	run("", 4000)
	run("b", 5000)
	run("a", 6000)
	if got := e.Stats()[0].LoRALoads; got != 3 {
		t.Fatalf("%d loads, want 3 (a, b, a again after b took the one slot)", got)
	}
	if got := e.LoRAState()[0].Resident; !slices.Equal(got, []string{"a"}) {
		t.Fatalf("resident %q", got)
	}
	e.RemoveLoRA("a")
	run("a", 7000)
	if got := e.Stats()[0].LoRALoads; got != 4 {
		t.Fatalf("%d loads after an unload, want 4", got)
	}
}

// One step runs requests of at most MaxLoRAs adapters: with one slot, a
// request for b waits while a's run, and a later request for a (or the
// base model) is not held up behind it (vLLM skips the request, it keeps
// its place).
func TestLoRAStepHoldsMaxLoRAs(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{MaxLoRAs: 1, LoRALoadTime: time.Second})
	a1 := submit(t, e, Request{ID: "a1", Tokens: seq(1, 40), MaxTokens: 20, LoRA: "a"})
	b := submit(t, e, Request{ID: "b", Tokens: seq(100, 40), MaxTokens: 1, LoRA: "b"})
	a2 := submit(t, e, Request{ID: "a2", Tokens: seq(200, 40), MaxTokens: 1, LoRA: "a"})
	base := submit(t, e, Request{ID: "base", Tokens: seq(300, 40), MaxTokens: 1})
	c := e.ranks[0]
	c.mu.Lock()
	_, _, ok := c.schedule()
	planned := []string{}
	for _, r := range c.plan {
		planned = append(planned, r.id)
	}
	st := e.ranks[0].lora
	c.mu.Unlock()
	if !ok || !slices.Equal(planned, []string{"a1", "a2", "base"}) {
		t.Fatalf("first step planned %q, want a1, a2 and base (b skipped: one adapter slot)", planned)
	}
	if !slices.Equal(st.resident, []string{"a"}) {
		t.Fatalf("resident %q after the first step", st.resident)
	}
	c.mu.Lock()
	c.complete(c.planGen)
	c.endStep()
	c.mu.Unlock()
	runIdle(t, e)
	ra1, rb := result(t, a1), result(t, b)
	result(t, a2)
	result(t, base)
	if rb.E2E < ra1.E2E {
		t.Fatalf("b finished (%v) before a1 (%v) released the adapter slot", rb.E2E, ra1.E2E)
	}
	if n := e.Stats()[0].LoRALoads; n != 2 {
		t.Fatalf("%d loads, want 2", n)
	}
}

// Without MaxLoRAs adapters are not modelled: nothing is loaded, nothing
// waits (the NATS-native worker's behaviour before adapters were modelled).
func TestLoRAOffByDefault(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{})
	for i, l := range []string{"a", "b", "c"} {
		submit(t, e, Request{Tokens: seq(i*100, 40), MaxTokens: 1, LoRA: l})
	}
	runIdle(t, e)
	if n := e.Stats()[0].LoRALoads; n != 0 {
		t.Fatalf("%d loads with adapters off", n)
	}
	if err := (Config{Worker: "w", Model: "m", MaxLoRAs: -1}).withDefaults().validate(); err == nil {
		t.Fatal("negative MaxLoRAs accepted")
	}
}

// The vLLM events of a salted adapter request carry what vLLM's do:
// lora_name and lora_id on every BlockStored, the adapter name in every
// block's extra_keys and the salt in the first block's only; the bridge's
// converter reading them computes the engine's own hashes.
func TestVLLMEventsCarrySaltAndAdapter(t *testing.T) {
	v := newVLLMEvents(t, vllmTestConfig(100), 1)
	e, _, _ := newTestEngine(t, Config{NewEmitter: v.Factory(), MaxBatchedTokens: 32})
	p := v.Publisher(0)
	f := newFollower(t, e.Keys()[0], p, newMirror(t))
	waitSubscribed(t, p)
	submit(t, e, Request{Tokens: seq(1, 80), MaxTokens: 1, LoRA: "sql", LoRAID: 3, CacheSalt: "t1"})
	runIdle(t, e)
	submit(t, e, Request{Tokens: seq(1, 80), MaxTokens: 1, CacheSalt: "t2"})
	runIdle(t, e)
	f.catchUp(p)
	key := e.Keys()[0]
	if got, want := f.m.seqs(key), e.Dump()[key]; !slices.Equal(got, want) || len(want) != 10 {
		t.Fatalf("view %d blocks, engine %d (want 2 x 5)", len(got), len(want))
	}
	res, err := vllmzmq.Replay(context.Background(), p.ReplayEndpoint(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var stored []vllm.Event
	for _, b := range res.Batches {
		var vb vllm.Batch
		if err := vllm.DecodeBatch(b.Payload, &vb); err != nil {
			t.Fatal(err)
		}
		for _, ev := range vb.Events {
			if ev.Kind == kvevents.KindStored {
				stored = append(stored, ev)
			}
		}
	}
	// Chunked prefill (32 tokens a step): each request stores its blocks
	// over several events, only the first of them without a parent.
	var salts []string
	for _, ev := range stored {
		if ev.HasParent != (ev.CacheSalt == "") {
			t.Errorf("event with parent %v has salt %q: the salt belongs to the first block only", ev.HasParent, ev.CacheSalt)
		}
		if ev.CacheSalt != "" {
			salts = append(salts, ev.CacheSalt)
		}
		if lora := ev.LoraName == "sql"; lora != (ev.HasLoraID && ev.LoraID == 3) {
			t.Errorf("lora_name %q with lora_id %v/%d", ev.LoraName, ev.HasLoraID, ev.LoraID)
		}
	}
	if !slices.Equal(salts, []string{"t1", "t2"}) || len(stored) < 4 {
		t.Fatalf("%d stored events, salts %q", len(stored), salts)
	}
}
