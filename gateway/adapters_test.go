package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// addLoRAEngine is addEngine for an engine serving adapters, registered
// with them as a bridge registers it.
func (f *fleet) addLoRAEngine(ctx context.Context, id string, adapters ...string) *testEngine {
	f.t.Helper()
	mk := sim.PublisherFactory(f.js, kvevents.PublisherConfig{Model: testModel, MaxDelay: time.Millisecond})
	eng, err := sim.New(sim.Config{Worker: id, Model: testModel, KVBlocks: 4096, Speedup: 200, MaxLoRAs: 2,
		NewEmitter: func(rank uint32, epoch uint64) (sim.EventEmitter, error) { return mk(id, rank, epoch) }})
	if err != nil {
		f.t.Fatal(err)
	}
	var as []vllmapi.Adapter
	for _, a := range adapters {
		as = append(as, vllmapi.Adapter{Name: a, Path: "/a/" + a})
	}
	face, err := vllmapi.New(vllmapi.Config{Engine: eng, MaxModelLen: 4096, Logger: testLogger(), EnableLoRA: true, Adapters: as})
	if err != nil {
		f.t.Fatal(err)
	}
	te := &testEngine{id: id, eng: eng, done: make(chan struct{}), http: httptest.NewServer(face)}
	runCtx, stop := context.WithCancel(context.Background())
	te.stop = stop
	go func() { defer close(te.done); _ = eng.Run(runCtx) }()
	info := eng.Info()
	info.Endpoint, info.Adapters = te.http.URL+"/v1", workers.SortAdapters(adapters)
	if te.reg, err = workers.Register(ctx, f.js, testRegistry(), info); err != nil {
		f.t.Fatal(err)
	}
	f.engines = append(f.engines, te)
	f.t.Cleanup(te.close)
	return te
}

// post sends a JSON body to the gateway; it returns the reply, its
// routing headers and the engine's cached_tokens.
type reply struct {
	status  int
	body    string
	worker  string
	overlap int
	cached  int
	model   string
}

func postJSON(t *testing.T, url string, body any) reply {
	t.Helper()
	data, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, body: string(raw), worker: resp.Header.Get(HeaderWorker)}
	r.overlap, _ = strconv.Atoi(resp.Header.Get(HeaderOverlapBlocks))
	var v struct {
		Model string `json:"model"`
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(raw, &v) == nil {
		r.cached, r.model = v.Usage.Details.Cached, v.Model
	}
	return r
}

// An adapter's name is a model: /v1/models lists it with its parent; a
// request for it goes only to workers serving it, reaches the engine under
// its name, and its next turn matches its own blocks (not the base
// model's); a name no worker serves is 404.
func TestAdapterAsModel(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1})
	ctx := ctxT(t)
	f.addLoRAEngine(ctx, "e0", "sql")
	f.addLoRAEngine(ctx, "e1", "sql", "zh")
	f.addEngine(ctx, "e2", true)
	f.waitWorkers(3)
	url := f.gateway(nil, nil)

	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []modelCard `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) != 3 || models.Data[0].ID != testModel || models.Data[1] != (modelCard{ID: "sql", Object: "model", OwnedBy: "kvrouter", Parent: testModel}) ||
		models.Data[2].ID != "zh" {
		t.Fatalf("/v1/models: %v %+v", err, models.Data)
	}

	prompt := strings.Repeat("an adapter's prompt, long enough for blocks ", 8)
	complete := func(model, p string) reply {
		t.Helper()
		r := postJSON(t, url+"/v1/completions", map[string]any{"model": model, "prompt": p, "max_tokens": 2})
		if r.status != http.StatusOK || r.model != model {
			t.Fatalf("%s: %d %s", model, r.status, r.body)
		}
		return r
	}
	for i := range 6 {
		if r := complete("zh", prompt+strconv.Itoa(i)); r.worker != "e1#0" {
			t.Fatalf("zh went to %s, only e1 serves it", r.worker)
		}
		if r := complete("sql", prompt+"sql"+strconv.Itoa(i)); r.worker == "e2#0" {
			t.Fatal("sql went to e2, which does not serve it")
		}
	}
	// The base model on the same prompt finds none of zh's blocks; zh
	// again finds its own, where it ran.
	first := complete("zh", prompt+"again")
	if r := complete(testModel, prompt+"again"); r.overlap != 0 || r.cached != 0 {
		t.Fatalf("the base model matched the adapter's blocks: %+v", r)
	}
	if r := complete("zh", prompt+"again"); r.worker != first.worker || r.overlap == 0 || r.cached != r.overlap*16 {
		t.Fatalf("zh's second turn: %+v, first on %s", r, first.worker)
	}
	if r := postJSON(t, url+"/v1/completions", map[string]any{"model": "nope", "prompt": "x"}); r.status != http.StatusNotFound {
		t.Fatalf("unknown model: %d %s", r.status, r.body)
	}
}

// cache_salt: checked as vLLM checks it; a salted request never matches
// another salt's blocks or the unsalted ones, and matches its own.
func TestCacheSaltRoutes(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 2})
	url := f.gateway(nil, nil)
	msgs := []map[string]string{{"role": "user", "content": strings.Repeat("tenant data, the same for both tenants ", 8)}}
	chat := func(salt any) reply {
		t.Helper()
		body := map[string]any{"model": testModel, "messages": msgs, "max_tokens": 2}
		if salt != nil {
			body["cache_salt"] = salt
		}
		return postJSON(t, url+"/v1/chat/completions", body)
	}
	for _, c := range []struct {
		salt any
		want int // overlap and cached blocks
	}{{"tenant-a", 0}, {"tenant-b", 0}, {nil, 0}, {"tenant-a", -1}, {"tenant-b", -1}} {
		r := chat(c.salt)
		if r.status != http.StatusOK {
			t.Fatalf("salt %v: %d %s", c.salt, r.status, r.body)
		}
		if c.want == 0 && (r.overlap != 0 || r.cached != 0) || c.want < 0 && (r.overlap == 0 || r.cached != r.overlap*16) {
			t.Fatalf("salt %v: overlap %d, cached %d", c.salt, r.overlap, r.cached)
		}
	}
	for _, bad := range []any{"", 5, strings.Repeat("s", MaxCacheSaltBytes+1)} {
		if r := chat(bad); r.status != http.StatusBadRequest || !strings.Contains(r.body, "cache_salt") {
			t.Errorf("cache_salt %.20v: %d %s", bad, r.status, r.body)
		}
	}
}

func TestRetryStaysWithinAllowed(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 3})
	g, err := New(Config{Router: ReplicaRouter{R: f.replicas[0]}, Models: []string{testModel}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if got := g.retryAllowed(ctx, &api.RouteRequest{Model: testModel, AllowedWorkers: []string{"e0", "e1"}}, "e0"); !slices.Equal(got, []string{"e1"}) {
		t.Fatalf("retry within [e0 e1] after e0 failed: %v", got)
	}
	if got := g.retryAllowed(ctx, &api.RouteRequest{Model: testModel}, "e0"); len(got) != 2 || slices.Contains(got, "e0") {
		t.Fatalf("retry without an allowed set after e0 failed: %v", got)
	}
}

// The approx scheme's pseudo-blocks of an adapter or a salt are their own.
func TestNamespaceBlocks(t *testing.T) {
	base := []uint64{1, 2, 3}
	keys := map[string][]uint64{}
	for _, c := range []struct{ lora, salt string }{{"", ""}, {"sql", ""}, {"", "s"}, {"sql", "s"}} {
		rq := &api.RouteRequest{BlockHashes: slices.Clone(base), LoraName: c.lora, CacheSalt: c.salt}
		namespaceBlocks(rq)
		for k, v := range keys {
			if slices.ContainsFunc(rq.BlockHashes, func(h uint64) bool { return slices.Contains(v, h) }) {
				t.Fatalf("%+v shares a pseudo-block with %s", c, k)
			}
		}
		keys[c.lora+"/"+c.salt] = rq.BlockHashes
	}
	if !slices.Equal(keys["/"], base) {
		t.Fatal("the base model's pseudo-blocks changed")
	}
}
