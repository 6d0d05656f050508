package realpath

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// pdStack is two prefill engines (e0, e1) and two decode engines (e2, e3),
// every one with vLLM's NixlConnector and its bridge registering its
// kv_role, two replicas, and a gateway in vLLM PD mode over replica 0.
func pdStack(t *testing.T) (*stack, string) {
	roles := map[string]workers.Role{"e0": workers.RolePrefill, "e1": workers.RolePrefill, "e2": workers.RoleDecode, "e3": workers.RoleDecode}
	st := startStack(t, stackOpts{engines: 4, replicas: 2, kvBlocks: 4096, roles: roles, face: func(c *vllmapi.Config) {
		c.KVTransfer = &vllmapi.KVTransferConfig{Connector: "NixlConnector", Role: "kv_both"}
	}})
	gw := st.gatewayURL(gateway.ReplicaRouter{R: st.replicas[0]}, func(c *gateway.Config) { c.PD = gateway.PDVLLM })
	return st, gw
}

// legLog records, per engine, the kv_transfer_params each leg carried:
// what prefill engines answered and what decode engines were given.
type legLog struct {
	mu       sync.Mutex
	answered map[string][]json.RawMessage // prefill engine -> its replies' kv_transfer_params
	given    map[string][]json.RawMessage // decode engine -> its requests' kv_transfer_params
	plain    map[string]int               // engine -> requests without kv_transfer_params
}

// record intercepts every engine's chat requests into l.
func (l *legLog) record(st *stack) {
	l.answered, l.given, l.plain = map[string][]json.RawMessage{}, map[string][]json.RawMessage{}, map[string]int{}
	for _, e := range st.engines {
		f := func(w http.ResponseWriter, r *http.Request, next http.Handler) {
			if r.URL.Path != "/v1/chat/completions" {
				next.ServeHTTP(w, r)
				return
			}
			kv := requestKV(r)
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			l.mu.Lock()
			switch {
			case kv == nil:
				l.plain[e.id]++
			case bytes.Contains(kv, []byte(`"do_remote_decode":true`)):
				var reply struct {
					KV json.RawMessage `json:"kv_transfer_params"`
				}
				_ = json.Unmarshal(rec.Body.Bytes(), &reply)
				l.answered[e.id] = append(l.answered[e.id], reply.KV)
			default:
				l.given[e.id] = append(l.given[e.id], kv)
			}
			l.mu.Unlock()
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
		}
		e.intercept.Store(&f)
	}
}

// requestKV reads r's kv_transfer_params (nil without), leaving the body
// readable.
func requestKV(r *http.Request) json.RawMessage {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	_ = json.Unmarshal(body, &req)
	if len(req.KV) == 0 || string(req.KV) == "null" {
		return nil
	}
	return req.KV
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// A two-turn chat over a split fleet, through the official OpenAI client:
// each turn prefills on a prefill engine and decodes on a decode engine;
// the decode engine gets exactly the kv_transfer_params its prefill engine
// answered; turn 2 prefills on the engine holding turn 1's prompt and
// decodes on the session's decode worker, whose cached tokens equal the
// router's predicted overlap; every booking is freed.
func TestPDTwoTurnChat(t *testing.T) {
	st, gw := pdStack(t)
	var log legLog
	log.record(st)
	client := openai.NewClient(option.WithBaseURL(gw+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0), option.WithHTTPClient(st.http))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage(longText("split the prefill from the decode", 600))}
	var prefillW, decodeW []string
	for turn := range 2 {
		var hr *http.Response
		r, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, MaxCompletionTokens: openai.Int(8)},
			option.WithHeader("X-Session-Id", "pd-conv"), option.WithResponseInto(&hr))
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		p, d := hr.Header.Get(gateway.HeaderPrefillWorker), hr.Header.Get(gateway.HeaderWorker)
		prefillW, decodeW = append(prefillW, p), append(decodeW, d)
		if (p != "e0#0" && p != "e1#0") || (d != "e2#0" && d != "e3#0") {
			t.Fatalf("turn %d: prefill on %q, decode on %q", turn, p, d)
		}
		if turn == 1 {
			overlap, _ := strconv.Atoi(hr.Header.Get(gateway.HeaderOverlapBlocks))
			if cached := int(r.Usage.PromptTokensDetails.CachedTokens); cached == 0 || cached != overlap*testBlock {
				t.Errorf("turn 1: the decode engine cached %d tokens, the router predicted %d blocks", cached, overlap)
			}
		}
		msgs = append(msgs, openai.AssistantMessage(r.Choices[0].Message.Content), openai.UserMessage("go on, turn "+strconv.Itoa(turn)))
		st.indexesCaughtUp()
	}
	if prefillW[1] != prefillW[0] || decodeW[1] != decodeW[0] {
		t.Errorf("turn 2 prefilled on %s and decoded on %s; turn 1 on %s and %s", prefillW[1], decodeW[1], prefillW[0], decodeW[0])
	}
	log.mu.Lock()
	pe, de := strings.TrimSuffix(prefillW[0], "#0"), strings.TrimSuffix(decodeW[0], "#0")
	if a, g := log.answered[pe], log.given[de]; len(a) != 2 || len(g) != 2 || !sameJSON(a[0], g[0]) || !sameJSON(a[1], g[1]) {
		t.Errorf("prefill answered %s, decode was given %s", a, g)
	}
	log.mu.Unlock()
	st.waitIdle()
}

// A prefill leg that fails (the prefill engines answer 500) falls back to
// the decode worker alone, which gets the client's request unchanged; the
// router charges that worker the prompt's prefill once told (serve_whole),
// before the request reaches it; no booking is left.
func TestPDPrefillFailureFallsBack(t *testing.T) {
	st, gw := pdStack(t)
	var plain, charged sync.Map
	for _, e := range st.engines {
		f := func(w http.ResponseWriter, r *http.Request, next http.Handler) {
			kv := requestKV(r)
			switch {
			case kv != nil && bytes.Contains(kv, []byte(`"do_remote_decode":true`)):
				http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
				return
			case kv == nil && r.URL.Path == "/v1/chat/completions":
				plain.Store(e.id, true)
				if ws, err := st.list(st.replicas[0]); err == nil { // the gateway's replica holds the booking
					for _, w := range ws.Workers {
						if w.Worker == e.id && w.Load != nil {
							charged.Store(e.id, w.Load.PrefillTokens)
						}
					}
				}
			}
			next.ServeHTTP(w, r)
		}
		e.intercept.Store(&f)
	}
	res := st.chatTurn(gw, "pd-fail", chatBody(longText("a prefill that fails", 600)))
	if res.worker != "e2#0" && res.worker != "e3#0" {
		t.Fatalf("the reply came from %q, want a decode worker", res.worker)
	}
	dec := strings.TrimSuffix(res.worker, "#0")
	if _, ok := plain.Load(dec); !ok {
		t.Fatalf("the decode worker %s was not sent the plain request", res.worker)
	}
	if v, _ := charged.Load(dec); v == nil || v.(int) == 0 {
		t.Fatalf("the decode worker %s carried %v prefill tokens when the whole request reached it, want the prompt's", dec, v)
	}
	st.waitIdle()
}

// A client that goes away during either leg cancels it and frees both
// bookings.
func TestPDClientDisconnectFreesBothBookings(t *testing.T) {
	for _, leg := range []string{"prefill", "decode"} {
		t.Run(leg, func(t *testing.T) {
			st, gw := pdStack(t)
			reached := make(chan struct{}, 1)
			for _, e := range st.engines {
				f := func(w http.ResponseWriter, r *http.Request, next http.Handler) {
					kv := requestKV(r)
					isPrefill := kv != nil && bytes.Contains(kv, []byte(`"do_remote_decode":true`))
					if kv != nil && isPrefill == (leg == "prefill") {
						select {
						case reached <- struct{}{}:
						default:
						}
						<-r.Context().Done() // hold the leg until the client goes
						return
					}
					next.ServeHTTP(w, r)
				}
				e.intercept.Store(&f)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/v1/chat/completions", bytes.NewReader(chatBody(longText("going away", 600))))
				req.Header.Set("Content-Type", "application/json")
				resp, err := st.http.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			select {
			case <-reached:
			case <-time.After(20 * time.Second):
				t.Fatalf("the %s leg never reached an engine", leg)
			}
			cancel()
			<-done
			st.waitIdle()
		})
	}
}

// chatBody is a one-message chat request body.
func chatBody(text string) []byte {
	b, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	return b
}

// SGLang's mode: both legs at once with a bootstrap room; the decode
// engine pulls the prefill engine's blocks through the prefill engine's
// bootstrap (its registered port) and streams the reply.
func TestPDSGLangBootstrapRoom(t *testing.T) {
	roles := map[string]workers.Role{"p0": workers.RolePrefill, "d0": workers.RoleDecode}
	st := startStack(t, stackOpts{replicas: 1, roles: roles})
	var engines []*engine
	for _, id := range []string{"p0", "d0"} {
		e := st.startEngineWith(id, sim.Config{KVBlocks: 4096}, vllmapi.Config{Disaggregation: string(roles[id])})
		st.startBridge(e, 0)
		engines = append(engines, e)
	}
	st.waitReady(2)
	gw := st.gatewayURL(gateway.ReplicaRouter{R: st.replicas[0]}, func(c *gateway.Config) { c.PD = gateway.PDSGLang })
	res := st.chatTurn(gw, "sg", chatBody(longText("a bootstrap room", 600)))
	if res.worker != "d0#0" {
		t.Fatalf("decoded on %q, want d0#0", res.worker)
	}
	if n := engines[1].eng.Stats()[0].TransferredBlocks; n == 0 {
		t.Fatal("the decode engine pulled no block")
	}
	if n := engines[0].eng.Stats()[0].PrefillTokens; n == 0 {
		t.Fatal("the prefill engine computed nothing")
	}
	st.waitIdle()
}
