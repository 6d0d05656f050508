package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecodeRouteRequest checks that the hand-written decoder never panics,
// that every rejection is a bad_request naming a field, that whatever it
// accepts survives an encode/decode round trip unchanged, and that where
// encoding/json also accepts the input both read the same request.
func FuzzDecodeRouteRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","token_ids":[1,2,3]}`,
		`{"v":1,"model":"m","block_hashes":[1,"2"],"block_size":16,"session_id":"s","pin":{"worker":"w","rank":0}}`,
		`{"model":"m","token_ids":[1],"session_id":"s","session_mode":"soft"}`,
		`{"model":"m","prefer":{"worker":"w"},"allowed_workers":["a","b"],"priority":-1,"x":{"y":[null,true,1e5]}}`,
		`{"model":"\ud83d\ude00\u00e9\n","token_ids":[]}`,
		`{"model":"m","token_ids":[1],"token_ids":null,"pin":{"worker":"a"},"pin":null}`,
		`{"Model":"m","token_ids":[7]}`, `{"model":"m","allowed_workers":[]}`,
		`{"model":null}`, `[]`, `{`, `{"model":"m"}}`,
		`{"model":"m","token_ids":[1,2,3,4],"media":[{"id":"img","offset":1,"length":2},{"offset":3,"length":1,"x":null}]}`,
		`{"model":"m","token_ids":[1],"media":[{"ID":"a","Offset":0}],"media":null}`,
		`{"model":"m","block_size":16}` + "\x00\x01\x00\x00\x00\x04\x03\x02\x01",
		`{"model":"m","token_ids":[1]}` + "\x00\x01\x00\x00\x00", `{"model":"m"}` + "\x00\x01",
		`{"model":"m","block_size":16}` + "\x01\x00\x01\x00\x00\x00\x00\x00\x00",
		`{"model":"m","block_hashes":[3]}` + "\x01\x01\x00\x00\x00\x00\x00\x00\x00", `{"model":"m"}` + "\x01\x00",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r RouteRequest
		body, _, _, _ := splitTrailer(data) // the JSON, before any binary trailer
		if !checkDecoded(t, body, DecodeRouteRequest(data, &r)) {
			return
		}
		for _, enc := range []func(*RouteRequest) []byte{
			func(r *RouteRequest) []byte { return AppendRouteRequest(nil, r) },
			func(r *RouteRequest) []byte { return AppendRouteBody(nil, r) },
		} {
			var again RouteRequest
			if err := DecodeRouteRequest(enc(&r), &again); err != nil {
				t.Fatalf("re-decode: %v", err)
			}
			want := r
			normalize(&want)
			normalize(&again)
			if !reflect.DeepEqual(want, again) {
				t.Fatalf("round trip changed request:\n%+v\n%+v", want, again)
			}
		}
		normalize(&r)
		// encoding/json folds the case of keys; this decoder matches them
		// exactly (documented). Compare only inputs without such keys.
		if foldedKeys(data) {
			return
		}
		var std RouteRequest
		if json.Unmarshal(data, &std) != nil {
			return // quoted hashes, or a value past a limit encoding/json does not know
		}
		normalize(&std)
		if !reflect.DeepEqual(r, std) {
			t.Fatalf("hand decoder and encoding/json disagree on %q:\n%+v\n%+v", data, r, std)
		}
	})
}

func normalize(x *RouteRequest) {
	if len(x.TokenIDs) == 0 {
		x.TokenIDs = nil
	}
	if len(x.BlockHashes) == 0 {
		x.BlockHashes = nil
	}
	if len(x.AllowedWorkers) == 0 {
		x.AllowedWorkers = nil
	}
	if len(x.Media) == 0 {
		x.Media = nil
	}
}

// foldedKeys reports whether an object key of the request (or of its pin
// and prefer) equals a known key only when case is folded.
func foldedKeys(data []byte) bool {
	known := map[string]bool{}
	for _, k := range []string{"v", "request_id", "model", "token_ids", "block_hashes", "block_size", "input_tokens",
		"lora_name", "cache_salt", "session_id", "session_mode", "pin", "prefer", "allowed_workers", "priority",
		"expected_output_tokens", "deadline_ms", "worker", "rank", "media", "id", "offset", "length"} {
		known[k] = true
	}
	folded := func(obj map[string]json.RawMessage) bool {
		for k := range obj {
			if known[k] {
				continue
			}
			for kk := range known {
				if strings.EqualFold(k, kk) {
					return true
				}
			}
		}
		return false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) != nil {
		return false
	}
	if folded(top) {
		return true
	}
	for _, k := range []string{"pin", "prefer"} {
		var sub map[string]json.RawMessage
		if json.Unmarshal(top[k], &sub) == nil && folded(sub) {
			return true
		}
	}
	var items []map[string]json.RawMessage
	if json.Unmarshal(top["media"], &items) == nil {
		for _, it := range items {
			if folded(it) {
				return true
			}
		}
	}
	return false
}

// FuzzDecodeLifecycleRequest: never panics; rejections name a field;
// accepted input is valid JSON.
func FuzzDecodeLifecycleRequest(f *testing.F) {
	for _, s := range []string{`{"v":1,"request_id":"r","model":"m","attempt":3,"replica":"x"}`, `{}`, `{"attempt":-1}`, `[`, `{"x":[{"y":null}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var lr LifecycleRequest
		if !checkDecoded(t, data, DecodeLifecycleRequest(data, &lr)) || len(bytes.TrimSpace(data)) == 0 {
			return
		}
		var std LifecycleRequest
		if foldedKeysOf(data, lifecycleKeys) || json.Unmarshal(data, &std) != nil {
			return
		}
		if lr != std {
			t.Fatalf("hand decoder and encoding/json disagree on %q:\n%+v\n%+v", data, lr, std)
		}
	})
}

var (
	lifecycleKeys = []string{"v", "request_id", "model", "attempt", "fence", "replica"}
	responseKeys  = []string{"v", "request_id", "model", "worker", "rank", "endpoint", "overlap_blocks", "prompt_blocks",
		"attempt", "fence", "replica", "queue_wait_us", "binding", "pd", "pd_reason", "prefill",
		"session_id", "outcome", "mode", "has_rank", "version", "bootstrap_port"}
)

// foldedKeysOf reports whether any object key anywhere in data equals one
// of known only when case is folded (encoding/json would read it, the hand
// decoders skip it).
func foldedKeysOf(data []byte, known []string) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		k, ok := tok.(string)
		if !ok {
			continue
		}
		for _, kk := range known {
			if k != kk && strings.EqualFold(k, kk) {
				return true
			}
		}
	}
}

// checkDecoded checks a decoder's verdict on data: a rejection is a
// bad_request naming a field, an acceptance is of valid JSON (or, for a
// lifecycle body, of nothing but white space). It reports acceptance.
func checkDecoded(t *testing.T, data []byte, err error) bool {
	t.Helper()
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeBadRequest || e.Field == "" {
			t.Fatalf("rejection %v is not a bad_request with a field", err)
		}
		return false
	}
	if !json.Valid(data) && len(bytes.TrimSpace(data)) > 0 {
		t.Fatalf("accepted invalid JSON %q", data)
	}
	return true
}

// FuzzDecodeRouteResponse: the client's decoder never panics and what it
// accepts re-encodes to the same answer.
func FuzzDecodeRouteResponse(f *testing.F) {
	f.Add(AppendRouteResponse(nil, &RouteResponse{V: 1, RequestID: "r", Worker: "w", Binding: &BindingInfo{SessionID: "s", Outcome: "fresh", HasRank: true}}))
	f.Add([]byte(`{"binding":null,"x":[1]}`))
	f.Add(AppendRouteResponse(nil, &RouteResponse{V: 1, RequestID: "r\u00e9\n", Worker: "w", Rank: 3, QueueWaitUS: -1, PD: PDSplit,
		Prefill: &PrefillRoute{RequestID: "r-prefill", Worker: "p", Attempt: 1 << 63, Fence: "f", BootstrapPort: 8998}}))
	f.Add([]byte(`{"prefill":{"rank":1},"prefill":{"worker":"a"},"binding":{"has_rank":true,"x":null},"Worker":"w"}`))
	f.Add([]byte(` {"v":1, "rank": 4294967296}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r RouteResponse
		if err := DecodeRouteResponse(data, &r); err != nil {
			return
		}
		var again RouteResponse
		if err := DecodeRouteResponse(AppendRouteResponse(nil, &r), &again); err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, r, again)
		}
		var std RouteResponse
		if foldedKeysOf(data, responseKeys) || json.Unmarshal(data, &std) != nil {
			return
		}
		if !reflect.DeepEqual(r, std) {
			t.Fatalf("hand decoder and encoding/json disagree on %q:\n%+v\n%+v", data, r, std)
		}
	})
}
