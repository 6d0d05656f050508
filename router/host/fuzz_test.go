package host

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodeRouteRequest checks that the hand-written decoder never panics,
// that every rejection is a bad_request naming a field, and that whatever it
// accepts survives an encode/decode round trip unchanged.
func FuzzDecodeRouteRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","token_ids":[1,2,3]}`,
		`{"v":1,"model":"m","block_hashes":[1,"2"],"block_size":16,"session_id":"s","pin":{"worker":"w","rank":0}}`,
		`{"model":"m","prefer":{"worker":"w"},"allowed_workers":["a","b"],"priority":-1,"x":{"y":[null,true,1e5]}}`,
		`{"model":"\ud83d\ude00\u00e9\n","token_ids":[]}`,
		`{"model":null}`, `[]`, `{`, `{"model":"m"}}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r RouteRequest
		err := DecodeRouteRequest(data, &r)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeBadRequest || e.Field == "" {
				t.Fatalf("rejection %v is not a bad_request with a field", err)
			}
			return
		}
		// Accepted input is valid JSON.
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		var again RouteRequest
		if err := DecodeRouteRequest(AppendRouteRequest(nil, &r), &again); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		norm := func(x *RouteRequest) {
			if len(x.TokenIDs) == 0 {
				x.TokenIDs = nil
			}
			if len(x.BlockHashes) == 0 {
				x.BlockHashes = nil
			}
			if len(x.AllowedWorkers) == 0 {
				x.AllowedWorkers = nil
			}
		}
		norm(&r)
		norm(&again)
		if !reflect.DeepEqual(r, again) {
			t.Fatalf("round trip changed request:\n%+v\n%+v", r, again)
		}
	})
}

// FuzzDecodeLifecycleRequest: never panics; rejections name a field;
// accepted input is valid JSON.
func FuzzDecodeLifecycleRequest(f *testing.F) {
	for _, s := range []string{`{"v":1,"request_id":"r","model":"m","attempt":3,"replica":"x"}`, `{}`, `{"attempt":-1}`, `[`, `{"x":[{"y":null}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var lr LifecycleRequest
		if err := DecodeLifecycleRequest(data, &lr); err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeBadRequest || e.Field == "" {
				t.Fatalf("rejection %v is not a bad_request with a field", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
	})
}

// FuzzDecodeRouteResponse: the client's decoder never panics and what it
// accepts re-encodes to the same answer.
func FuzzDecodeRouteResponse(f *testing.F) {
	f.Add(AppendRouteResponse(nil, &RouteResponse{V: 1, RequestID: "r", Worker: "w", Binding: &BindingInfo{SessionID: "s", Outcome: "fresh", HasRank: true}}))
	f.Add([]byte(`{"binding":null,"x":[1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r RouteResponse
		if err := DecodeRouteResponse(data, &r); err != nil {
			return
		}
		var again RouteResponse
		if err := DecodeRouteResponse(AppendRouteResponse(nil, &r), &again); err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, r, again)
		}
	})
}
