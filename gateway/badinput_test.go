package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/openai/openai-go/v3"
)

// post sends body to the gateway at base+path and decodes the OpenAI error.
func post(t *testing.T, base, path, body string, hdr map[string]string) (*http.Response, errorBody) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var eb errorBody
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(data, &eb); err != nil || eb.Error.Message == "" {
			t.Fatalf("status %d body %q is not OpenAI's error shape", resp.StatusCode, data)
		}
	}
	return resp, eb
}

// Every bad input gets OpenAI's error shape with its status, and books
// nothing.
func TestBadInput(t *testing.T) {
	f := startFleet(t, fleetOpts{replicas: 1, engines: 1})
	base := f.gateway(nil, func(c *Config) { c.MaxBodyBytes = 64 << 10 })
	chat := "/v1/chat/completions"
	cases := []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		code, param      string
	}{
		{"bad json", chat, `{"model":`, nil, 400, "invalid_request_error", ""},
		{"empty body", chat, ``, nil, 400, "invalid_request_error", ""},
		{"wrong type", chat, `{"model":7,"messages":[]}`, nil, 400, "invalid_request_error", ""},
		{"missing model", chat, `{"messages":[{"role":"user","content":"hi"}]}`, nil, 400, "invalid_request_error", "model"},
		{"missing messages", chat, `{"model":"m"}`, nil, 400, "invalid_request_error", "messages"},
		{"missing prompt", "/v1/completions", `{"model":"m"}`, nil, 400, "invalid_request_error", "prompt"},
		{"negative max_tokens", chat, `{"model":"m","messages":[],"max_tokens":-1}`, nil, 400, "invalid_request_error", "max_tokens"},
		{"unknown model", chat, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, nil, 404, "model_not_found", ""},
		{"over-long prompt", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 5000) + `"}`, nil, 400, "context_length_exceeded", "prompt"},
		{"over-long with output", chat, `{"model":"m","max_tokens":4000,"messages":[{"role":"user","content":"` + strings.Repeat("x", 200) + `"}]}`, nil, 400, "context_length_exceeded", "messages"},
		{"bad session mode", chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, map[string]string{ModeHeader: "firm"}, 400, "invalid_request_error", ModeHeader},
		{"long session id", chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, map[string]string{DefaultSessionHeader: strings.Repeat("s", 300)}, 400, "invalid_request_error", DefaultSessionHeader},
		{"unknown path", "/v1/embeddings", `{}`, nil, 404, "unknown_url", ""},
		{"engine refuses the prompt", chat, `{"model":"m","messages":[{"role":"user","content":5}]}`, nil, 400, "invalid_request_error", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, eb := post(t, base, c.path, c.body, c.hdr)
			if resp.StatusCode != c.status || eb.Error.Code != c.code {
				t.Fatalf("status %d code %q (%s), want %d %q", resp.StatusCode, eb.Error.Code, eb.Error.Message, c.status, c.code)
			}
			if got := ""; eb.Error.Param != nil {
				got = *eb.Error.Param
				if got != c.param {
					t.Fatalf("param %q, want %q", got, c.param)
				}
			} else if c.param != "" {
				t.Fatalf("no param, want %q", c.param)
			}
		})
	}
	t.Run("method", func(t *testing.T) {
		resp, err := http.Get(base + chat)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("GET %s: %d", chat, resp.StatusCode)
		}
	})
	t.Run("too large", func(t *testing.T) {
		resp, _ := post(t, base, chat, `{"model":"m","messages":[],"x":"`+strings.Repeat("x", 64<<10)+`"}`, nil)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	f.waitIdle()
}

// fakeRouter answers every route with err and lists one worker whose
// endpoint is engine.
type fakeRouter struct {
	err    error
	engine string
}

func (r fakeRouter) Route(context.Context, *api.RouteRequest, *api.RouteResponse) error { return r.err }
func (fakeRouter) PrefillDone(context.Context, string, *api.RouteResponse) error        { return nil }
func (fakeRouter) Free(context.Context, string, *api.RouteResponse) error               { return nil }
func (fakeRouter) ServeWhole(context.Context, string, *api.RouteResponse) error         { return nil }
func (fakeRouter) Cancel(context.Context, string, string, string) error                 { return nil }
func (r fakeRouter) Workers(context.Context, string) (*api.WorkersResponse, error) {
	return &api.WorkersResponse{Workers: []api.WorkerStatus{{Worker: "w", Model: testModel, Endpoint: r.engine, State: "ready"}}}, nil
}

// The router's refusals: 529 becomes 429 with Retry-After, no eligible
// worker and no router 503, a Hard binding that cannot take the request
// 409. The tokenize endpoint is down: the request still routes (on load).
func TestRouterErrors(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		status int
	}{
		{"overloaded", api.NewError(api.CodeOverloaded, "queue full", nil), http.StatusTooManyRequests},
		{"no eligible worker", api.NewError(api.CodeNoEligibleWorker, "no worker", nil), http.StatusServiceUnavailable},
		{"no router", api.ErrNoRouter, http.StatusServiceUnavailable},
		{"binding rejected", api.NewError(api.CodeBindingRejected, "bound elsewhere", nil), http.StatusConflict},
		{"prompt too long for NATS", api.NewError(api.CodePayloadTooLarge, "past max_payload", nil), http.StatusRequestEntityTooLarge},
		{"internal", errors.New("boom"), http.StatusInternalServerError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := New(Config{Router: fakeRouter{err: c.err, engine: refusingEndpoint(t)}, Models: []string{testModel}, Logger: testLogger()})
			if err != nil {
				t.Fatal(err)
			}
			s := httptest.NewServer(g)
			defer s.Close()
			resp, eb := post(t, s.URL, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d (%+v), want %d", resp.StatusCode, eb, c.status)
			}
			if ra := resp.Header.Get("Retry-After"); (c.status == http.StatusTooManyRequests) != (ra != "") {
				t.Fatalf("Retry-After %q on %d", ra, resp.StatusCode)
			}
			// The official client reads the shape too.
			oc := client(s.URL)
			_, err = oc.Chat.Completions.New(context.Background(), chatParams(false, openai.UserMessage("hi")))
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != c.status || apiErr.Message == "" {
				t.Fatalf("client error %v", err)
			}
		})
	}
}

// The request reader never panics, whatever it accepts has a model and the
// prompt field of its endpoint, and its hand reader (clientRequest.scan)
// reads what encoding/json reads wherever it does not hand the body over.
//
// TestKnownKeys keeps scan's list of names in step with the struct.
func FuzzReadRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_completion_tokens":3}`,
		`{"model":"m","prompt":"hi","max_tokens":5,"user":"u"}`,
		`{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":[[1,2]]}`, `{"model":""}`, `[]`, `null`, `{"model":"m","prompt":null}`,
		`{"Model":"m","prompt":"x"}`, `{"model":"m\u00e9","prompt":"x","stream":null,"max_tokens":null}`, `{"model":"m","max_tokens":1e2,"prompt":"x"}`,
		`{"model":"m","max_tokens":99999999999999999999,"prompt":"x"}`, `{"model":"m","stream":"yes","prompt":"x"}`,
		`{"model":"m","prompt":"x","model":null,"add_generation_prompt":false,"tools":[],"cache_salt":"s","unknown":{"a":[1]}}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		kind := kindCompletion
		if chat {
			kind = kindChat
		}
		cr, e := readRequest(kind, body)
		if e != nil {
			if e.Status != http.StatusBadRequest || e.Message == "" {
				t.Fatalf("refusal %+v", e)
			}
			return
		}
		if cr.Model == "" || (chat && !isJSONArray(cr.Messages)) || (!chat && isNull(cr.Prompt)) {
			t.Fatalf("accepted %q as %+v", body, cr)
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid %q", body)
		}
		// The hand reader, where it answers, answers as encoding/json.
		var fast, slow clientRequest
		if fast.scan(body) {
			if err := json.Unmarshal(body, &slow); err != nil {
				t.Fatalf("scan took %q, encoding/json refuses it: %v", body, err)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("%q: scan read %+v, encoding/json %+v", body, fast, slow)
			}
		}
		_, _ = promptIDs(cr.Prompt)
		_, _ = promptText(cr.Prompt)
		_ = cr.outputTokens()
	})
}

// decodeTokenizeReply reads what encoding/json reads, and refuses what it
// refuses.
func FuzzDecodeTokenizeReply(f *testing.F) {
	for _, s := range []string{`{"count":3,"max_model_len":8,"tokens":[1,2,3],"token_strs":null}`, `{"count":0,"tokens":[]}`,
		`{"tokens" : [ 4294967295 , 0 ], "count":2}`, `{"count":1,"tokens":[4294967296]}`, `{"count":2,"tokens":[1,]}`,
		`{"count":1,"tokens":[-1]}`, `{"count":1,"tokens":["1"]}`, `{"count":1,"tokens":[1]`, `{"x":"\"tokens\":[1]","count":1,"tokens":[2]}`, `{"m":{"tokens":[1]},"count":1,"tokens":[2]}`,
		`{"tokens":[1],"count":1,"tokens":[2]}`, `{"a":"tokens","count":1,"tokens":[5]}`, `{"m":{"tokens":[1]},"count":1}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeTokenizeReply(data)
		var want struct {
			Count       int      `json:"count"`
			MaxModelLen int      `json:"max_model_len"`
			Tokens      []uint32 `json:"tokens"`
		}
		jerr := json.Unmarshal(data, &want)
		switch {
		case err == nil && jerr != nil:
			t.Fatalf("%q: accepted %+v, encoding/json: %v", data, got, jerr)
		case err != nil && jerr == nil && len(want.Tokens) > 0:
			t.Fatalf("%q: refused (%v), encoding/json reads %+v", data, err, want)
		case err == nil && (!slices.Equal(got.Tokens, want.Tokens) && len(want.Tokens)+len(got.Tokens) > 0 || got.Count != want.Count || got.MaxModelLen != want.MaxModelLen):
			t.Fatalf("%q: %+v, encoding/json %+v", data, got, want)
		}
	})
}

// promptIDs reads what encoding/json reads as a prompt of ids ([ids] or
// [[ids]], non-empty), and nothing else.
func FuzzPromptIDs(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, `[[1,2,3]]`, ` [ [ 4294967295 , 0 ] ] `, `[4294967296]`, `[1,]`, `[-1]`, `["1"]`,
		`[01]`, `[0]`, `[]`, `[[]]`, `[[1],[2]]`, `[1.0]`, `[1e3]`, `"text"`, `[[1]`, `[1]]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return // the client's body was valid JSON before the prompt was cut out of it
		}
		got, ok := promptIDs(data)
		want, wok := promptIDsJSON(data)
		if ok != wok || (ok && !slices.Equal(got, want)) {
			t.Fatalf("%q: %v %v, encoding/json %v %v", data, got, ok, want, wok)
		}
	})
}

// promptIDsJSON is promptIDs by encoding/json: the model it is checked
// against.
func promptIDsJSON(raw []byte) ([]uint32, bool) {
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		return ids, len(ids) > 0
	}
	var nested [][]uint32
	if json.Unmarshal(raw, &nested) == nil && len(nested) == 1 && len(nested[0]) > 0 {
		return nested[0], true
	}
	return nil, false
}

// The hand reader's list of JSON names is clientRequest's: a field added to
// the struct without a case in member would be ignored by the fast path.
func TestKnownKeys(t *testing.T) {
	var names []string
	var walk func(reflect.Type)
	walk = func(rt reflect.Type) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			if tag := strings.Split(f.Tag.Get("json"), ",")[0]; tag != "" {
				names = append(names, tag)
			}
		}
	}
	walk(reflect.TypeFor[clientRequest]())
	slices.Sort(names)
	known := slices.Sorted(slices.Values(knownKeys))
	if !slices.Equal(names, known) {
		t.Fatalf("struct names %v, knownKeys %v", names, known)
	}
	for _, k := range names {
		var cr clientRequest
		if !cr.member([]byte(k), []byte("null")) {
			t.Errorf("member %q: null not taken", k)
		}
	}
}
