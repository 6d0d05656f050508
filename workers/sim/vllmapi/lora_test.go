package vllmapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/workers/sim"
)

// newLoRAServer is newServerWith at speed-up 1000 with a context of 4,096
// tokens.
func newLoRAServer(t testing.TB, ec sim.Config, cfg Config) (*httptest.Server, *sim.Engine) {
	t.Helper()
	ec.Speedup, cfg.MaxModelLen = 1000, 4096
	return newServerWith(t, ec, cfg)
}

func TestParseLoRAModule(t *testing.T) {
	for in, want := range map[string]Adapter{
		"sql=/adapters/sql": {Name: "sql", Path: "/adapters/sql"},
		`{"name": "zh", "path": "/a/zh", "base_model_name": "base"}`: {Name: "zh", Path: "/a/zh", Base: "base"},
	} {
		got, err := ParseLoRAModule(in)
		if err != nil || got != want {
			t.Errorf("ParseLoRAModule(%s) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"sql", "=p", "sql=", `{"name":"x"}`, `{"name":`} {
		if _, err := ParseLoRAModule(in); err == nil {
			t.Errorf("ParseLoRAModule(%s) accepted", in)
		}
	}
}

// Adapters are model cards with their parent and path; a request names one
// as its model and is answered under that name; the same prompt under an
// adapter and the base model shares no cached block, under one adapter it
// does.
func TestAdaptersServedUnderTheirNames(t *testing.T) {
	hs, eng := newLoRAServer(t, sim.Config{MaxLoRAs: 1}, Config{EnableLoRA: true, Adapters: []Adapter{
		{Name: "sql", Path: "/a/sql"}, {Name: "zh", Path: "/a/zh", Base: "other-base"}}})
	resp, err := http.Get(hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID, Root    string
			Parent      *string
			MaxModelLen *int `json:"max_model_len"`
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) != 3 {
		t.Fatalf("/v1/models: %v %+v", err, models)
	}
	base, sql, zh := models.Data[0], models.Data[1], models.Data[2]
	if base.ID != testModel || base.Parent != nil || base.MaxModelLen == nil ||
		sql.ID != "sql" || sql.Root != "/a/sql" || sql.Parent == nil || *sql.Parent != testModel || sql.MaxModelLen != nil ||
		zh.ID != "zh" || zh.Parent == nil || *zh.Parent != "other-base" {
		t.Fatalf("/v1/models cards %+v", models.Data)
	}
	prompt := strings.Repeat("the same long prompt for every model ", 20)
	cached := func(model string) int {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
		code, out := post(t, hs, "/v1/completions", string(body))
		var r completionReply
		if code != http.StatusOK || json.Unmarshal([]byte(out), &r) != nil || r.Model != model {
			t.Fatalf("%s: %d %s", model, code, out)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	if cached(testModel) != 0 || cached("sql") != 0 || cached("zh") != 0 {
		t.Fatal("an adapter was served the base model's (or another adapter's) blocks")
	}
	if cached("sql") == 0 || cached(testModel) == 0 {
		t.Fatal("the same model again found nothing in the cache")
	}
	if n := eng.Stats()[0].LoRALoads; n != 3 {
		t.Fatalf("%d adapter loads with one slot (sql, zh, sql), want 3", n)
	}
	if code, _ := post(t, hs, "/v1/completions", `{"model":"nope","prompt":"x","max_tokens":1}`); code != http.StatusNotFound {
		t.Fatalf("unknown model: %d", code)
	}
	if code, out := post(t, hs, "/tokenize", `{"model":"sql","prompt":"abc"}`); code != http.StatusOK || !strings.Contains(out, `"count":3`) {
		t.Fatalf("tokenize with an adapter's name: %d %s", code, out)
	}
	if code, _ := post(t, hs, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/x"}`); code != http.StatusNotFound {
		t.Fatalf("load without runtime updating: %d, want 404", code)
	}
}

// cache_salt, as vLLM: a non-empty string; each salt its own cache.
func TestCacheSalt(t *testing.T) {
	hs, _ := newTestServer(t, sim.Config{}, 4096)
	prompt := strings.Repeat("a salted prompt ", 30)
	cached := func(salt any) int {
		t.Helper()
		req := map[string]any{"model": testModel, "messages": []map[string]string{{"role": "user", "content": prompt}}, "max_tokens": 1}
		if salt != nil {
			req["cache_salt"] = salt
		}
		body, _ := json.Marshal(req)
		code, out := post(t, hs, "/v1/chat/completions", string(body))
		var r chatReply
		if code != http.StatusOK || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("salt %v: %d %s", salt, code, out)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	if cached("a") != 0 || cached("b") != 0 || cached(nil) != 0 {
		t.Fatal("a salted request was served another salt's blocks")
	}
	if cached("a") == 0 || cached("b") == 0 || cached(nil) == 0 {
		t.Fatal("the same salt again found nothing")
	}
	for _, bad := range []string{`""`, `5`} {
		code, out := post(t, hs, "/v1/completions", `{"model":"`+testModel+`","prompt":"x","max_tokens":1,"cache_salt":`+bad+`}`)
		if code != http.StatusBadRequest {
			t.Errorf("cache_salt %s: %d %s", bad, code, out)
		}
	}
}

// Runtime loading and unloading as vLLM's endpoints answer them; the
// metrics name the slot count and count loads.
func TestRuntimeLoRAUpdating(t *testing.T) {
	hs, _ := newLoRAServer(t, sim.Config{MaxLoRAs: 2, LoRALoadTime: time.Second}, Config{EnableLoRA: true, RuntimeLoRA: true})
	for _, c := range []struct {
		path, body string
		code       int
		reply      string
	}{
		{"/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/a/sql"}`, 200, "Success: LoRA adapter 'sql' added successfully."},
		{"/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/a/sql"}`, 400, "has already been loaded"},
		{"/v1/load_lora_adapter", `{"lora_name":"x"}`, 400, "Both 'lora_name' and 'lora_path' must be provided."},
		{"/v1/completions", `{"model":"sql","prompt":"hello there","max_tokens":1}`, 200, `"model":"sql"`},
		{"/v1/unload_lora_adapter", `{"lora_name":"sql"}`, 200, "Success: LoRA adapter 'sql' removed successfully."},
		{"/v1/unload_lora_adapter", `{"lora_name":"sql"}`, 404, "cannot be found"},
		{"/v1/unload_lora_adapter", `{}`, 400, "needs to be provided"},
		{"/v1/completions", `{"model":"sql","prompt":"hello there","max_tokens":1}`, 404, "does not exist"},
	} {
		code, out := post(t, hs, c.path, c.body)
		if code != c.code || !strings.Contains(out, c.reply) {
			t.Fatalf("POST %s %s: %d %s, want %d with %q", c.path, c.body, code, out, c.code, c.reply)
		}
	}
	resp, err := http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	page := string(raw)
	for _, want := range []string{`vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""}`,
		`kvr_sim_lora_loads_total{engine="0",model_name="` + testModel + `"} 1`} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// Adapters need EnableLoRA, as in vLLM.
func TestAdaptersNeedEnableLoRA(t *testing.T) {
	eng, err := sim.New(sim.Config{Worker: "w", Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(context.Background())
	for _, cfg := range []Config{{Adapters: []Adapter{{Name: "a", Path: "/a"}}}, {RuntimeLoRA: true},
		{EnableLoRA: true, Adapters: []Adapter{{Name: testModel, Path: "/a"}}},
		{EnableLoRA: true, Adapters: []Adapter{{Name: "a", Path: "/a"}, {Name: "a", Path: "/b"}}}} {
		cfg.Engine = eng
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}
