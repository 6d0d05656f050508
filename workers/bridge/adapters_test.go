package bridge

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// vllm:lora_requests_info keeps a series per label set it ever had, each
// set to the time of its update: the newest is the current state.
func TestLoRAInfoReadsTheNewestSeries(t *testing.T) {
	const page = `# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,zh",waiting_lora_adapters="fr"} 1.8e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.75e9
`
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	li := loraInfoOf(fams["vllm:lora_requests_info"])
	if !slices.Equal(li.running, []string{"sql", "zh"}) || li.maxLoRAs != 2 {
		t.Fatalf("%+v", li)
	}
	if li := loraInfoOf(nil); li.maxLoRAs != 0 || li.running != nil {
		t.Fatalf("no family: %+v", li)
	}
}

// The tracker's loaded list is the last max_lora adapters seen in use.
func TestAdapterTrackerIsTheEnginesLRU(t *testing.T) {
	var a adapterTracker
	a.scraped(loraInfo{running: []string{"a"}, maxLoRAs: 2})
	a.scraped(loraInfo{running: []string{"b"}})
	a.scraped(loraInfo{running: []string{"a"}})
	a.scraped(loraInfo{running: []string{"c"}})
	if _, loaded, n := a.lists(); !slices.Equal(loaded, []string{"a", "c"}) || n != 2 {
		t.Fatalf("loaded %q of %d slots, want a and c (b least recently used)", loaded, n)
	}
	a.restarted()
	if _, loaded, _ := a.lists(); len(loaded) != 0 {
		t.Fatalf("loaded %q after a restart", loaded)
	}
}

// startLoRAEngine is startEngine's engine serving adapters (--enable-lora,
// runtime updating on) with maxLoRAs slots.
func startLoRAEngine(t *testing.T, worker string, maxLoRAs int, adapters ...string) (*engine, string) {
	t.Helper()
	ec := vllmzmq.DefaultConfig()
	ec.EnableKVCacheEvents, ec.Topic = true, "kv"
	ec.Endpoint, ec.ReplayEndpoint = "tcp://*:0", "tcp://*:0"
	ev, err := sim.NewVLLMEvents(ec, 1, quiet)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := sim.New(sim.Config{Worker: worker, Model: testModel, BlockSize: testBlock, KVBlocks: 256, Speedup: 1000,
		MaxLoRAs: maxLoRAs, LoRALoadTime: time.Second, NewEmitter: ev.Factory()})
	if err != nil {
		ev.Close()
		t.Fatal(err)
	}
	var as []vllmapi.Adapter
	for _, a := range adapters {
		as = append(as, vllmapi.Adapter{Name: a, Path: "/adapters/" + a})
	}
	api, err := vllmapi.New(vllmapi.Config{Engine: eng, Model: testModel, Logger: quiet, EnableLoRA: true, Adapters: as, RuntimeLoRA: true})
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{eng: eng, events: ev, worker: worker, ran: make(chan struct{}), srv: httptest.NewServer(api)}
	ctx, cancel := context.WithCancel(context.Background())
	e.stopRun = cancel
	go func() { defer close(e.ran); eng.Run(ctx) }()
	t.Cleanup(e.close)
	return e, e.srv.URL
}

// The bridge registers the adapters the engine serves (its /v1/models,
// runtime loads included) and the ones it holds: after requests for sql,
// zh and fr with two slots, zh and fr.
func TestBridgeRegistersAdapters(t *testing.T) {
	f := newFleet(t)
	e, url := startLoRAEngine(t, "lw", 2, "sql", "zh", "fr")
	runBridge(t, f, bridgeCfg(e, "lw"))
	wait := func(what string, ok func(workers.Info) bool) {
		t.Helper()
		var last workers.Info
		testutil.Eventually(t, 10*time.Second, func() bool {
			info, found := registered(t, f.js, "lw")
			last = info
			return found && ok(info)
		}, func() string {
			return what + ": registry says " + strings.Join(last.Adapters, ",") + " / " + strings.Join(last.LoadedAdapters, ",")
		})
	}
	wait("served adapters", func(i workers.Info) bool {
		return slices.Equal(i.Adapters, []string{"fr", "sql", "zh"}) && i.MaxLoRAs == 2 && len(i.LoadedAdapters) == 0
	})
	client := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	complete := func(model string) {
		t.Helper()
		resp, err := client.Post(url+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","prompt":"`+strings.Repeat("a prompt of more than one block ", 3)+`","max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", model, resp.Status)
		}
	}
	complete("sql")
	complete("zh")
	wait("sql and zh loaded", func(i workers.Info) bool { return slices.Equal(i.LoadedAdapters, []string{"sql", "zh"}) })
	complete("fr")
	wait("fr in, sql out", func(i workers.Info) bool { return slices.Equal(i.LoadedAdapters, []string{"fr", "zh"}) })
	if got := e.eng.LoRAState()[0].Resident; !slices.Equal(got, []string{"zh", "fr"}) {
		t.Fatalf("the engine holds %q", got)
	}
	resp, err := client.Post(url+"/v1/load_lora_adapter", "application/json", strings.NewReader(`{"lora_name":"de","lora_path":"/a/de"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	wait("a runtime load", func(i workers.Info) bool { return i.ServesAdapter("de") })
}
