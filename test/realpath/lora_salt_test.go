package realpath

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// Rows of the real-path invariant for the request fields that change an
// engine's block hashes besides the prompt: LoRA adapters and cache salts.
// For every request the overlap the router predicted (X-Kvr-Overlap-Blocks)
// equals the engine's cached_tokens in whole blocks, and the same prompts
// under another adapter, the base model or another salt never match.

// variant is one way of sending a conversation: a model (the base model or
// an adapter's name) and a cache salt ("" = none).
type variant struct{ model, salt string }

func (v variant) String() string {
	if v.salt == "" {
		return v.model
	}
	return v.model + "+" + v.salt
}

// rowStats are a row's counts.
type rowStats struct {
	requests, matched, hits, firstTurns int
}

// check logs the row's counts and requires at least 50 requests, every
// turn after the first a cache hit (each variant matches its own blocks).
func (s rowStats) check(t *testing.T, row string) {
	t.Helper()
	t.Logf("%s row: %d of %d requests predicted exactly, %d with a cache hit, %d first turns isolated across variants",
		row, s.matched, s.requests, s.hits, s.firstTurns)
	if s.requests < 50 || s.hits < s.requests-s.firstTurns {
		t.Fatalf("%+v: want >= 50 requests, every later turn a hit", s)
	}
}

// startLoRAEngine starts an engine as `kvrouter sim serve --enable-lora
// --lora-modules ... --max-loras maxLoRAs` starts it, with a bridge.
func (st *stack) startLoRAEngine(id string, maxLoRAs int, adapters ...string) *engine {
	st.t.Helper()
	var as []vllmapi.Adapter
	for _, a := range adapters {
		as = append(as, vllmapi.Adapter{Name: a, Path: "/adapters/" + a})
	}
	e := st.startEngineWith(id, sim.Config{KVBlocks: 8192, MaxLoRAs: maxLoRAs, LoRALoadTime: 2 * time.Second},
		vllmapi.Config{EnableLoRA: true, Adapters: as})
	st.startBridge(e, 0)
	return e
}

// settled waits until every replica indexes as many blocks on worker as its
// engine holds (no engine here evicts: equal counts are equal sets), so the
// next request's overlap is not ahead of or behind the events.
func (st *stack) settled(worker string) {
	st.t.Helper()
	var e *engine
	for _, x := range st.engines {
		if x.id == worker {
			e = x
		}
	}
	want := len(e.eng.Dump()[workerref.Target{Worker: worker}])
	testutil.Eventually(st.t, 10*time.Second, func() bool {
		for _, r := range st.replicas {
			if st.indexed(r, worker, 0) != want {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("the replicas to index the %d blocks of %s: %s", want, worker, st.workers())
	})
}

// runRow sends convs conversations of turns turns each, every turn under
// every variant with the same user messages (each variant keeps its own
// replies, in its own session), through the gateway at url, and checks the
// invariant on every request and the isolation of the variants on every
// conversation's first turn.
func (st *stack) runRow(t *testing.T, url string, variants []variant, convs, turns int) rowStats {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0), option.WithHTTPClient(hc))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var s rowStats
	for conv := range convs {
		hist := make([][]openai.ChatCompletionMessageParamUnion, len(variants))
		first := 0 // cached tokens of the first variant's first turn
		for turn := range turns {
			// Distinct from the first byte of content: conversations
			// share no block but the template's first few bytes.
			msg := longText(fmt.Sprintf("%d: conversation %d, the same words under every variant", conv, conv), 180)
			if turn > 0 {
				msg = "and then, turn " + strconv.Itoa(turn) + "?"
			}
			for i, v := range variants {
				hist[i] = append(hist[i], openai.UserMessage(msg))
				var hr *http.Response
				opts := []option.RequestOption{option.WithResponseInto(&hr),
					option.WithHeader("X-Session-Id", fmt.Sprintf("row-%d-%s", conv, v))}
				if v.salt != "" {
					opts = append(opts, option.WithJSONSet("cache_salt", v.salt))
				}
				r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: v.model, Messages: hist[i],
					MaxCompletionTokens: openai.Int(24)}, opts...)
				if err != nil {
					t.Fatalf("conversation %d turn %d %s: %v", conv, turn, v, err)
				}
				hist[i] = append(hist[i], openai.AssistantMessage(r.Choices[0].Message.Content))
				overlap, _ := strconv.Atoi(hr.Header.Get(gateway.HeaderOverlapBlocks))
				cached, prompt := int(r.Usage.PromptTokensDetails.CachedTokens), int(r.Usage.PromptTokens)
				// The engine always computes the last prompt token (as
				// vLLM): a fully cached prompt reports one block less.
				predicted := min(overlap, (prompt-1)/testBlock)
				s.requests++
				if predicted == cached/testBlock {
					s.matched++
				} else {
					t.Errorf("conversation %d turn %d %s on %s: the router predicted %d blocks, the engine had %d cached tokens (%d blocks)",
						conv, turn, v, hr.Header.Get(gateway.HeaderWorker), overlap, cached, cached/testBlock)
				}
				if overlap > 0 {
					s.hits++
				}
				// The first variant to send a conversation's first turn
				// finds at most blocks its own earlier conversations
				// share with it (the template's start); the others send
				// the identical prompt and must find no more.
				if turn == 0 {
					s.firstTurns++
					if i == 0 {
						first = cached
					}
					if cached > first || cached >= (prompt-1)/testBlock*testBlock {
						t.Errorf("conversation %d %s: its first turn found %d cached tokens (router %d blocks), the first variant %d: it matched another variant's identical prompt",
							conv, v, cached, overlap, first)
					}
				}
				st.settled(workerOf(t, hr))
			}
		}
	}
	return s
}

// Two LoRA adapters and the base model over the same prompts: 60 requests
// (4 conversations x 5 turns x 3 models) through the gateway over bridged
// engines that serve both adapters. Every prediction equals the engine's
// cache; no model ever matches another's blocks; later turns match their
// own.
func TestRealPathLoRAAdapters(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 2})
	st.startLoRAEngine("e0", 2, "sql", "zh")
	st.startLoRAEngine("e1", 2, "sql", "zh")
	st.waitReady(2)
	url := st.gatewayURL(gateway.ReplicaRouter{R: st.replicas[0]})
	st.runRow(t, url, []variant{{model: testModel}, {model: "sql"}, {model: "zh"}}, 4, 5).check(t, "lora")
	st.waitIdle()
}

// Two cache salts (and none) over the same prompts: 54 requests (6
// conversations x 3 turns x 3 salts) through the gateway.
func TestRealPathCacheSalts(t *testing.T) {
	st := startStack(t, stackOpts{engines: 2, replicas: 2, kvBlocks: 8192})
	url := st.gatewayURL(gateway.ReplicaRouter{R: st.replicas[0]})
	st.runRow(t, url, []variant{{model: testModel, salt: "tenant-a"}, {model: testModel, salt: "tenant-b"}, {model: testModel}}, 6, 3).check(t, "salt")
	st.waitIdle()
}

// Adapter residency: two engines started with --max-loras 2 serve four
// adapters. Requests for the adapters in a random order (distinct prompts:
// no cache to follow) go to a worker that holds their adapter whenever one
// does, and the engines load adapters far fewer times than round robin
// over the same sequence would make them.
func TestRealPathAdapterResidency(t *testing.T) {
	adapters := []string{"a", "b", "c", "d"}
	st := startStack(t, stackOpts{replicas: 1})
	st.startLoRAEngine("e0", 2, adapters...)
	st.startLoRAEngine("e1", 2, adapters...)
	st.waitReady(2)
	url := st.gatewayURL(gateway.ReplicaRouter{R: st.replicas[0]})
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0), option.WithHTTPClient(hc))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The replica's view of who holds what (from the bridges' registry
	// entries).
	holders := func(a string) []string {
		w, err := st.list(st.replicas[0])
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ws := range w.Workers {
			if slices.Contains(ws.LoadedAdapters, a) {
				out = append(out, ws.Worker)
			}
		}
		return out
	}
	seq := make([]string, 48)
	x := uint64(7)
	for i := range seq {
		x = x*6364136223846793005 + 1442695040888963407
		seq[i] = adapters[x>>62]
	}
	steered, held := 0, 0
	for i, a := range seq {
		before := holders(a)
		var hr *http.Response
		_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(a),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(longText(fmt.Sprintf("request %d for %s", i, a), 60))},
			MaxTokens: openai.Int(2)}, option.WithResponseInto(&hr))
		if err != nil {
			t.Fatalf("request %d (%s): %v", i, a, err)
		}
		worker := workerOf(t, hr)
		if len(before) > 0 {
			held++
			if slices.Contains(before, worker) {
				steered++
			} else {
				t.Errorf("request %d for %s went to %s, %v hold it", i, a, worker, before)
			}
		}
		// The next request routes on this one's outcome: the bridge has
		// seen the adapter in use and written it to the registry.
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Contains(holders(a), worker) },
			func() string { return fmt.Sprintf("the registry to show %s loaded on %s: %s", a, worker, st.workers()) })
	}
	var loads uint64
	for _, e := range st.engines {
		loads += e.eng.Stats()[0].LoRALoads
	}
	rr := roundRobinLoads(seq, 2, 2)
	t.Logf("residency: %d of %d requests whose adapter was loaded somewhere went to a holder; %d adapter loads, round robin would make %d",
		steered, held, loads, rr)
	if loads >= uint64(rr) || held < len(seq)/2 {
		t.Fatalf("%d loads (round robin: %d), %d of %d requests found their adapter loaded", loads, rr, held, len(seq))
	}
}

// roundRobinLoads is how many adapter loads engines with slots adapter
// slots each (least recently used out, as sim.Config.MaxLoRAs) make when
// the requests of seq go to them in turn.
func roundRobinLoads(seq []string, engines, slots int) int {
	lru := make([][]string, engines)
	loads := 0
	for i, a := range seq {
		l := lru[i%engines]
		if j := slices.Index(l, a); j >= 0 {
			l = slices.Delete(l, j, j+1)
		} else {
			loads++
			if len(l) == slots {
				l = l[1:]
			}
		}
		lru[i%engines] = append(l, a)
	}
	return loads
}

// workerOf is the worker a gateway reply names (X-Kvr-Worker: w#r).
func workerOf(t *testing.T, hr *http.Response) string {
	t.Helper()
	w, err := workerref.Parse(hr.Header.Get(gateway.HeaderWorker))
	if err != nil {
		t.Fatal(err)
	}
	return w.Worker
}
