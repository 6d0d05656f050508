package vllmapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/workers/sim"
)

func nixl(c *Config) { c.KVTransfer = &KVTransferConfig{Connector: "NixlConnector", Role: "kv_both"} }

// vLLM's two legs: a prefill with do_remote_decode answers with
// kv_transfer_params naming its blocks; a decode with those params skips
// the transferred blocks' prefill; without a connector the params are
// ignored.
func TestNixlLegs(t *testing.T) {
	ec := sim.Config{BlockSize: 16, Speedup: 1000}
	pre, preEng := newTestServer(t, ec, 4096, nixl)
	dec, decEng := newTestServer(t, ec, 4096, nixl)
	prompt := strings.Repeat("abcdefgh", 40) // 320 tokens: 20 blocks
	code, body := post(t, pre, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1,"stream":false,
		"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`, testModel, prompt))
	if code != http.StatusOK {
		t.Fatalf("prefill: %d %s", code, body)
	}
	var reply struct {
		KV map[string]json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal([]byte(body), &reply); err != nil {
		t.Fatal(err)
	}
	var ids []int
	if err := json.Unmarshal(reply.KV["remote_block_ids"], &ids); err != nil || len(ids) != 20 {
		t.Fatalf("remote_block_ids %s: want 20 blocks", reply.KV["remote_block_ids"])
	}
	for _, k := range []string{"remote_engine_id", "remote_host", "remote_port", "do_remote_prefill"} {
		if len(reply.KV[k]) == 0 || string(reply.KV[k]) == "null" {
			t.Fatalf("kv_transfer_params without %s: %s", k, body)
		}
	}
	kv, _ := json.Marshal(reply.KV)
	code, body = post(t, dec, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4,"kv_transfer_params":%s}`, testModel, prompt, kv))
	if code != http.StatusOK {
		t.Fatalf("decode: %d %s", code, body)
	}
	if s := decEng.Stats()[0]; s.TransferredBlocks != 19 || s.PrefillTokens != 16 {
		t.Fatalf("decode engine stats %+v: want 19 blocks transferred (the last token's block computed), 16 prefill tokens", s)
	}
	if s := preEng.Stats()[0]; s.PrefillTokens != 320 {
		t.Fatalf("prefill engine computed %d prompt tokens, want 320", s.PrefillTokens)
	}
	code, body = post(t, dec, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"x","kv_transfer_params":{"do_remote_prefill":true}}`, testModel))
	if code != http.StatusBadRequest {
		t.Fatalf("decode leg without the remote fields: %d %s", code, body)
	}
	plain, plainEng := newTestServer(t, ec, 4096)
	code, body = post(t, plain, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1,"kv_transfer_params":%s}`, testModel, prompt, kv))
	if code != http.StatusOK || strings.Contains(body, "kv_transfer_params") || plainEng.Stats()[0].TransferredBlocks != 0 {
		t.Fatalf("no connector: %d %s", code, body)
	}
}

// SGLang's legs run at once: the decode server waits for the prefill
// server's bootstrap room, then pulls its blocks.
func TestSGLangBootstrap(t *testing.T) {
	ec := sim.Config{BlockSize: 16, Speedup: 1000}
	pre, _ := newTestServer(t, ec, 4096, func(c *Config) { c.Disaggregation = DisaggPrefill })
	dec, decEng := newTestServer(t, ec, 4096, func(c *Config) { c.Disaggregation = DisaggDecode })
	host, port, _ := strings.Cut(strings.TrimPrefix(pre.URL, "http://"), ":")
	prompt := strings.Repeat("abcdefgh", 40)
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":3,"bootstrap_host":%q,"bootstrap_port":%s,"bootstrap_room":42}`, testModel, prompt, host, port)
	done := make(chan string, 1)
	go func() {
		code, b := post(t, dec, "/v1/completions", body)
		done <- fmt.Sprint(code, " ", b)
	}()
	if code, b := post(t, pre, "/v1/completions", body); code != http.StatusOK {
		t.Fatalf("prefill: %d %s", code, b)
	}
	if got := <-done; !strings.HasPrefix(got, "200 ") {
		t.Fatalf("decode: %s", got)
	}
	if s := decEng.Stats()[0]; s.TransferredBlocks != 19 {
		t.Fatalf("decode engine stats %+v: want 19 blocks transferred", s)
	}
	if code, b := post(t, dec, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"x"}`, testModel)); code != http.StatusBadRequest {
		t.Fatalf("decode server without bootstrap fields: %d %s", code, b)
	}
}
