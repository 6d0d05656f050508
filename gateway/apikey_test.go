package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// With an API key, the gateway answers the OpenAI SDK that sends it, and
// refuses a wrong or missing key with 401 in OpenAI's shape
// (invalid_api_key), on every path; the key does not reach the engine.
func TestAPIKey(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 1})
	var engineAuth []string
	inner := f.engines[0].http.Config.Handler
	f.engines[0].http.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		engineAuth = append(engineAuth, r.Header.Get("Authorization"))
		inner.ServeHTTP(w, r)
	})
	base := f.gateway(nil, func(c *Config) { c.APIKey = "sk-gw" })
	ctx := ctxT(t)

	c := client(base, option.WithAPIKey("sk-gw"))
	if _, err := c.Chat.Completions.New(ctx, chatParams(false, openai.UserMessage("hello"))); err != nil {
		t.Fatalf("with the key: %v", err)
	}
	for _, k := range engineAuth {
		if strings.Contains(k, "sk-gw") {
			t.Fatalf("the gateway's key reached the engine: %q", k)
		}
	}

	wrong := client(base, option.WithAPIKey("wrong"))
	_, err := wrong.Chat.Completions.New(ctx, chatParams(false, openai.UserMessage("hello")))
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != 401 || ae.Code != "invalid_api_key" {
		t.Fatalf("wrong key: %v, want 401 invalid_api_key", err)
	}
	for _, path := range []string{"/v1/models", "/v1/chat/completions", "/nope"} {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Post(base+path, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body errorBody
		if resp.StatusCode != 401 || json.Unmarshal(b, &body) != nil || body.Error.Code != "invalid_api_key" ||
			body.Error.Type != "invalid_request_error" {
			t.Errorf("%s without a key: %d %s", path, resp.StatusCode, b)
		}
	}
}
