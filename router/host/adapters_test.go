package host

import (
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workers"
)

// A route request naming an adapter goes to the worker whose registry entry
// says it holds the adapter, over an idle one that only serves it; GET
// /v1/workers shows the adapter lists; the prompt is hashed with the
// adapter (and the salt) in the seed, as the engines' events are.
func TestRouteWeighsLoadedAdapter(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	ctx := ctxT(t)
	for _, w := range []struct {
		id     string
		loaded []string
	}{{"lora-a", nil}, {"lora-b", []string{"sql"}}, {"lora-c", nil}} {
		reg, err := workers.Register(ctx, st.js, testRegistry(), workers.Info{ID: w.id, Model: testModel,
			Endpoint: "http://" + w.id + ":8000", Ranks: []uint32{0}, BlockSize: DefaultBlockSize, KVBlocks: 4096,
			MaxBatchedTokens: 8192, MaxSeqs: 256, Adapters: []string{"sql", "zh"}, LoadedAdapters: w.loaded, MaxLoRAs: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Stop)
	}
	st.waitWorkers(3)
	r := st.replicas[0]
	ws, err := r.Workers(testModel)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.Workers {
		if !slices.Equal(w.Adapters, []string{"sql", "zh"}) || w.MaxLoRAs != 2 || (w.Worker == "lora-b") != slices.Equal(w.LoadedAdapters, []string{"sql"}) {
			t.Fatalf("/v1/workers entry %+v", w)
		}
	}
	toks := tokens(3, 64)
	route := func(lora, salt string, toks []uint32) *api.RouteResponse {
		t.Helper()
		var resp api.RouteResponse
		if err := r.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: toks, LoraName: lora, CacheSalt: salt}, &resp); err != nil {
			t.Fatal(err)
		}
		if err := st.client.Free(ctx, testModel, &resp); err != nil {
			t.Fatal(err)
		}
		return &resp
	}
	for i := range 10 {
		if resp := route("sql", "", toks); resp.Worker != "lora-b" {
			t.Fatalf("request %d for sql went to %s, not to lora-b which holds it", i, resp.Worker)
		}
	}
	// Nobody holds zh: any worker (the term is off), spread by the
	// tie-break (distinct prompts: no cache to follow).
	seen := map[string]bool{}
	for i := range 30 {
		seen[route("zh", "", tokens(100+i, 64)).Worker] = true
	}
	if len(seen) < 2 {
		t.Fatalf("requests for zh all went to %v", seen)
	}
	// The predicted index records a routed prompt under the seed it was
	// hashed with: the same tokens for sql, under a salt, or for the base
	// model are different blocks.
	testutil.Eventually(t, 5*time.Second, func() bool { return route("sql", "", toks).OverlapBlocks > 0 },
		func() string { return "the predicted index did not record sql's blocks" })
	for _, c := range []struct{ lora, salt string }{{"", ""}, {"sql", "tenant"}, {"", "tenant"}} {
		want := kvevents.SeqHashes(nil, toks, DefaultBlockSize, kvevents.SeedFor(c.lora, c.salt))
		if resp := route(c.lora, c.salt, toks); resp.PromptBlocks != len(want) || (c.salt != "" && resp.OverlapBlocks != 0) {
			t.Fatalf("lora %q salt %q: %+v", c.lora, c.salt, resp)
		}
	}
}
