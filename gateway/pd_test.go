package gateway

import (
	"encoding/json"
	"testing"
)

// The prefill leg's body is vLLM's reference proxy's: do_remote_decode,
// no streaming, one token (max_completion_tokens too when present), no
// stream_options or minimum lengths; everything else as the client sent it.
func TestPrefillBody(t *testing.T) {
	in := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},
		"max_tokens":50,"max_completion_tokens":50,"min_tokens":3,"min_completion_tokens":3,"temperature":0.5}`
	out, err := prefillBody([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	kv, _ := m["kv_transfer_params"].(map[string]any)
	switch {
	case kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false:
		t.Errorf("kv_transfer_params %v", kv)
	case m["stream"] != false || m["max_tokens"] != 1.0 || m["max_completion_tokens"] != 1.0:
		t.Errorf("stream %v max_tokens %v max_completion_tokens %v", m["stream"], m["max_tokens"], m["max_completion_tokens"])
	case m["stream_options"] != nil || m["min_tokens"] != nil || m["min_completion_tokens"] != nil:
		t.Errorf("left in: %s", out)
	case m["temperature"] != 0.5 || m["model"] != "m":
		t.Errorf("client fields changed: %s", out)
	}
	if _, err := prefillBody([]byte(`[1]`)); err == nil {
		t.Error("a body that is not an object was accepted")
	}
	if hostOf("http://10.0.0.1:8100") != "10.0.0.1" || hostOf("http://[::1]:8100/") != "::1" {
		t.Errorf("hostOf: %q %q", hostOf("http://10.0.0.1:8100"), hostOf("http://[::1]:8100/"))
	}
}
