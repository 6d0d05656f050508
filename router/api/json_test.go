package api

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

func TestDecodeRouteRequest(t *testing.T) {
	body := `{"v":1,"request_id":"r-1","model":"llama","token_ids":[1,2,3,4294967295],
	"block_size":16,"lora_name":"l","cache_salt":"s\u00e9","session_id":"sess\"1","routing_key":"hi there",
	"pin":{"worker":"w1","rank":2},"prefer":{"worker":"w2"},"allowed_workers":["w1","w2"],
	"priority":-3,"expected_output_tokens":256,"deadline_ms":100,"unknown":{"a":[1,2.5e3,true,null,"x"]}}`
	var r RouteRequest
	if err := DecodeRouteRequest([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	want := RouteRequest{V: 1, RequestID: "r-1", Model: "llama", TokenIDs: []uint32{1, 2, 3, 4294967295},
		BlockSize: 16, LoraName: "l", CacheSalt: "sé", SessionID: `sess"1`, RoutingKey: "hi there",
		Pin: &WorkerRef{Worker: "w1", Rank: 2, HasRank: true}, Prefer: &WorkerRef{Worker: "w2"},
		AllowedWorkers: []string{"w1", "w2"}, Priority: -3, ExpectedOutputTokens: 256, DeadlineMS: 100}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("got %+v\nwant %+v", r, want)
	}
	// block hashes as numbers and quoted decimals
	r.Reset()
	if err := DecodeRouteRequest([]byte(`{"model":"m","block_hashes":[18446744073709551615,"42",7, "18446744073709551615"],"block_size":16}`), &r); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r.BlockHashes, []uint64{18446744073709551615, 42, 7, 18446744073709551615}) {
		t.Fatalf("hashes %v", r.BlockHashes)
	}
}

func TestDecodeRouteRequestErrors(t *testing.T) {
	long := strings.Repeat("x", MaxSessionIDLen+1)
	cases := []struct {
		name, body, field string
	}{
		{"empty", ``, "body"},
		{"not object", `[1]`, "body"},
		{"truncated", `{"model":"m"`, "body"},
		{"trailing", `{"model":"m"} x`, "body"},
		{"bad token", `{"model":"m","token_ids":[1,"a"]}`, "token_ids"},
		{"negative token", `{"model":"m","token_ids":[-1]}`, "token_ids"},
		{"token overflow", `{"model":"m","token_ids":[4294967296]}`, "token_ids"},
		{"fraction", `{"model":"m","token_ids":[1.5]}`, "token_ids"},
		{"hash overflow", `{"model":"m","block_hashes":[18446744073709551616]}`, "block_hashes"},
		{"long session", `{"model":"m","session_id":"` + long + `"}`, "session_id"},
		{"long routing key", `{"model":"m","routing_key":"` + strings.Repeat("k", MaxRoutingKeyLen+1) + `"}`, "routing_key"},
		{"pin without worker", `{"model":"m","pin":{"rank":1}}`, "pin.worker"},
		{"pin rank negative", `{"model":"m","pin":{"worker":"w","rank":-1}}`, "pin.rank"},
		{"model not string", `{"model":5}`, "model"},
		{"control char", "{\"model\":\"a\x01\"}", "model"},
		{"bad escape", `{"model":"\q"}`, "model"},
		{"leading zero", `{"model":"m","priority":01}`, "priority"},
		{"deep", `{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, "x"},
		{"bad utf8", "{\"model\":\"\xff\"}", "model"},
		{"empty allowed_workers", `{"model":"m","allowed_workers":[]}`, "allowed_workers"},
		{"token ids twice", `{"model":"m","token_ids":[1]}` + "\x00\x01\x00\x00\x00", "token_ids"},
		{"ragged trailer", `{"model":"m"}` + "\x00\x01\x00\x00", "token_ids"},
		{"truncated before trailer", `{"model":"m"` + "\x00\x01\x00\x00\x00", "body"},
		{"nul in a string", "{\"model\":\"a\x00\"}", "model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r RouteRequest
			err := DecodeRouteRequest([]byte(c.body), &r)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if !errors.Is(err, ErrBadRequest) || e.Status != 400 || e.Field != c.field {
				t.Fatalf("err = %#v, want bad_request on %q", e, c.field)
			}
		})
	}
}

func TestRouteResponseMatchesEncodingJSON(t *testing.T) {
	cases := []RouteResponse{
		{V: 1, RequestID: "r<1>&\u2028\x00", Model: "m", Worker: "w\"1", Rank: 3, Endpoint: "kvr.worker.m.w1.generate",
			OverlapBlocks: 7, PromptBlocks: 9, Attempt: 2, Fence: "f\"<0>", Replica: "a", QueueWaitUS: 12},
		{V: 1, RequestID: "r", Binding: &BindingInfo{SessionID: "s", Outcome: OutcomeCreated, Mode: "hard", Worker: "w", Version: 4, HasRank: true, Rank: 1}},
		{V: 1, Binding: &BindingInfo{SessionID: "s\xff", Outcome: OutcomeFresh}},
	}
	for _, c := range cases {
		want, err := json.Marshal(&c)
		if err != nil {
			t.Fatal(err)
		}
		got := AppendRouteResponse(nil, &c)
		if string(got) != string(want) {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	}
}

func TestLifecycleResponseMatchesEncodingJSON(t *testing.T) {
	for _, c := range []LifecycleResponse{
		{V: 1, RequestID: "r-1", Op: OpFree, Replica: "rep-0"},
		{RequestID: "r<1>&\u2028\x00\"", Op: OpPrefillDone, Replica: "a\xff"},
		{},
	} {
		want, err := json.Marshal(&c)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendLifecycleResponse(nil, &c); string(got) != string(want) {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	}
}

func TestRouteRequestRoundTrip(t *testing.T) {
	in := RouteRequest{V: 1, RequestID: "r", Model: "m", TokenIDs: []uint32{1, 2}, BlockSize: 16,
		SessionID: "s", Pin: &WorkerRef{Worker: "w", Rank: 1, HasRank: true}, Prefer: &WorkerRef{Worker: "p"},
		AllowedWorkers: []string{"w"}, Priority: 2, ExpectedOutputTokens: 5, DeadlineMS: 9, InputTokens: 40,
		BlockHashes: []uint64{1 << 63}, LoraName: "l", CacheSalt: "c", RoutingKey: "k",
		Media: []kvevents.MediaItem{{ID: "img\"1", Offset: 0, Length: 1}, {Offset: 1, Length: 1}}}
	for _, enc := range []func() []byte{
		func() []byte { return AppendRouteRequest(nil, &in) },
		func() []byte { return AppendRouteBody(nil, &in) },
		func() []byte { b, _ := json.Marshal(&in); return b },
	} {
		var out RouteRequest
		if err := DecodeRouteRequest(enc(), &out); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(in, out) {
			t.Fatalf("got %+v\nwant %+v", out, in)
		}
	}
	// encoding/json can read what the decoder reads, including WorkerRef.
	var viaStd RouteRequest
	if err := json.Unmarshal(AppendRouteRequest(nil, &in), &viaStd); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, viaStd) {
		t.Fatalf("encoding/json got %+v", viaStd)
	}
}

// The token trailer's bytes are the wire format other clients write:
// the JSON without token_ids, a NUL, then each id little-endian. Without
// token ids the body is the plain JSON. A null token_ids in the JSON is
// absence, so a trailer after it is the request's one set of ids.
func TestTokenTrailer(t *testing.T) {
	body := AppendRouteBody(nil, &RouteRequest{Model: "m", TokenIDs: []uint32{1, 0x01020304}, BlockSize: 16})
	want := `{"model":"m","block_size":16}` + "\x00" + "\x01\x00\x00\x00" + "\x04\x03\x02\x01"
	if string(body) != want {
		t.Fatalf("body %q, want %q", body, want)
	}
	if got := AppendRouteBody(nil, &RouteRequest{Model: "m"}); string(got) != `{"model":"m"}` {
		t.Fatalf("without token ids: %q", got)
	}
	// Both readers: the copy of a little-endian machine and the portable
	// loop (so this test must not run in parallel with other decoding).
	defer func(le bool) { littleEndian = le }(littleEndian)
	for _, le := range []bool{littleEndian, false} {
		littleEndian = le
		for _, c := range []struct {
			body string
			want []uint32
		}{
			{`{"model":"m","token_ids":null}` + "\x00\x07\x00\x00\x00", []uint32{7}},
			{"{\"model\":\"m\"} \n\x00\xff\xff\xff\xff", []uint32{1<<32 - 1}},
			{`{"model":"m"}` + "\x00", []uint32{}},
			{`{"model":"m"}` + "\x00\x04\x03\x02\x01\x00\x00\x01\x00", []uint32{0x01020304, 1 << 16}},
		} {
			r := RouteRequest{TokenIDs: []uint32{9, 9, 9}}
			if err := DecodeRouteRequest([]byte(c.body), &r); err != nil {
				t.Fatalf("%q: %v", c.body, err)
			}
			if !reflect.DeepEqual(r.TokenIDs, c.want) {
				t.Fatalf("little-endian copy %v: %q: token ids %v, want %v", le, c.body, r.TokenIDs, c.want)
			}
		}
	}
	over := append([]byte(`{"model":"m"}`+"\x00"), make([]byte, 4*(MaxTokens+1))...)
	var r RouteRequest
	var e *Error
	if err := DecodeRouteRequest(over, &r); !errors.As(err, &e) || e.Field != "token_ids" {
		t.Fatalf("%d ids in the trailer: %v, want bad_request on token_ids", MaxTokens+1, err)
	}
}

// The hash trailer's bytes: the JSON without block_hashes, the mark 0x01,
// then each hash little-endian. Token ids take the trailer when a request
// has both (the replica refuses such a request, but the encoding keeps
// it). Either trailer's bytes may hold the other's mark: the first mark in
// the body ends the JSON. Each malformed trailer is a bad_request on
// block_hashes.
func TestHashTrailer(t *testing.T) {
	body := AppendRouteBody(nil, &RouteRequest{Model: "m", BlockHashes: []uint64{1, 0x0100000000000002}, BlockSize: 16})
	want := `{"model":"m","block_size":16}` + "\x01" + "\x01\x00\x00\x00\x00\x00\x00\x00" + "\x02\x00\x00\x00\x00\x00\x00\x01"
	if string(body) != want {
		t.Fatalf("body %q, want %q", body, want)
	}
	both := AppendRouteBody(nil, &RouteRequest{Model: "m", TokenIDs: []uint32{1}, BlockHashes: []uint64{2}})
	if want := `{"model":"m","block_hashes":[2]}` + "\x00\x01\x00\x00\x00"; string(both) != want {
		t.Fatalf("both: body %q, want %q", both, want)
	}
	defer func(le bool) { littleEndian = le }(littleEndian)
	for _, le := range []bool{littleEndian, false} {
		littleEndian = le
		for _, c := range []struct {
			body   string
			hashes []uint64
			ids    []uint32
		}{
			{`{"model":"m","block_hashes":null}` + "\x01\x07\x00\x00\x00\x00\x00\x00\x00", []uint64{7}, nil},
			{"{\"model\":\"m\"} \n\x01\xff\xff\xff\xff\xff\xff\xff\xff", []uint64{1<<64 - 1}, nil},
			{`{"model":"m"}` + "\x01", []uint64{}, nil},
			{`{"model":"m"}` + "\x01\x00\x01\x00\x00\x00\x00\x00\x00", []uint64{1 << 8}, nil},
			{`{"model":"m","block_hashes":[5]}` + "\x00\x01\x00\x00\x00", []uint64{5}, []uint32{1}},
		} {
			r := RouteRequest{BlockHashes: []uint64{9, 9, 9}}
			if err := DecodeRouteRequest([]byte(c.body), &r); err != nil {
				t.Fatalf("%q: %v", c.body, err)
			}
			if !reflect.DeepEqual(r.BlockHashes, c.hashes) || len(r.TokenIDs) != len(c.ids) || (c.ids != nil && !reflect.DeepEqual(r.TokenIDs, c.ids)) {
				t.Fatalf("little-endian copy %v: %q: hashes %v ids %v, want %v %v", le, c.body, r.BlockHashes, r.TokenIDs, c.hashes, c.ids)
			}
		}
	}
	for _, c := range []struct{ name, body string }{
		{"ragged", `{"model":"m"}` + "\x01\x01\x00\x00\x00"},
		{"hashes twice", `{"model":"m","block_hashes":[1]}` + "\x01\x01\x00\x00\x00\x00\x00\x00\x00"},
		{"too many", `{"model":"m"}` + "\x01" + string(make([]byte, 8*(MaxBlockHashes+1)))},
	} {
		var r RouteRequest
		var e *Error
		if err := DecodeRouteRequest([]byte(c.body), &r); !errors.As(err, &e) || e.Field != "block_hashes" {
			t.Errorf("%s: %v, want bad_request on block_hashes", c.name, err)
		}
	}
}

func TestErrorEnvelope(t *testing.T) {
	e := BadField("session_id", "is %d bytes long", 300)
	b := AppendError(nil, e)
	want := `{"error":{"code":"bad_request","status":400,"field":"session_id","message":"is 300 bytes long"}}`
	if string(b) != want {
		t.Fatalf("got %s", b)
	}
	got := DecodeError(b)
	if got == nil || got.Code != CodeBadRequest || got.Field != "session_id" || got.Status != 400 {
		t.Fatalf("decoded %#v", got)
	}
	for _, ok := range []string{`{"v":1,"worker":"w"}`, `{"v":1,"error":{"code":"x"}}`, `["error"]`, ``, `{`} {
		if DecodeError([]byte(ok)) != nil {
			t.Fatalf("%q decoded as an error", ok)
		}
	}
	// Another writer's envelope may have white space.
	if got := DecodeError([]byte(" {\n \"error\" : {\"code\":\"not_found\",\"message\":\"m\"}}")); got == nil || got.Status != 404 {
		t.Fatalf("spaced envelope decoded as %#v", got)
	}
	for code, status := range map[string]int{CodeBadRequest: 400, CodeNotFound: 404, CodePinConflict: 409,
		CodeBindingRejected: 409, CodeNoEligibleWorker: 503, CodeOverloaded: 529, CodeInternal: 500} {
		if e := NewError(code, "x", nil); e.Status != status || !errors.Is(e, sentinelOf[code]) {
			t.Errorf("%s: status %d, want %d", code, e.Status, status)
		}
	}
}

func BenchmarkDecodeRouteRequest2048(b *testing.B) {
	benchDecodeRouteRequest(b, AppendRouteRequest(nil, request2048()))
}

// BenchmarkDecodeRouteBody2048 is BenchmarkDecodeRouteRequest2048's
// request as Client sends it: its token ids in the token trailer.
func BenchmarkDecodeRouteBody2048(b *testing.B) {
	benchDecodeRouteRequest(b, AppendRouteBody(nil, request2048()))
}

// BenchmarkAppendRouteBody2048: the client's side of
// BenchmarkDecodeRouteBody2048, the request encoded with its token trailer.
func BenchmarkAppendRouteBody2048(b *testing.B) {
	r := request2048()
	buf := AppendRouteBody(nil, r)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendRouteBody(buf[:0], r)
	}
}

// BenchmarkDecodeRouteHashes128 and BenchmarkDecodeRouteHashBody128: a
// 2,048-token prompt as 128 block hashes, in the JSON and in the hash
// trailer (as Client sends it).
func BenchmarkDecodeRouteHashes128(b *testing.B) {
	benchDecodeRouteRequest(b, AppendRouteRequest(nil, hashes128()))
}

func BenchmarkDecodeRouteHashBody128(b *testing.B) {
	benchDecodeRouteRequest(b, AppendRouteBody(nil, hashes128()))
}

// hashes128 is request2048's prompt as its 128 sequence block hashes.
func hashes128() *RouteRequest {
	r := request2048().AsBlockHashes(16)
	return &r
}

// request2048 is a route request of 2,048 token ids below 128,000.
func request2048() *RouteRequest {
	toks := make([]uint32, 2048)
	for i := range toks {
		toks[i] = uint32(i*7919) % 128000
	}
	return &RouteRequest{Model: "llama", TokenIDs: toks, ExpectedOutputTokens: 256}
}

// BenchmarkDecodeRouteRequestStrings: a request made mostly of strings,
// some plain (rawString's fast path) and some with escapes, \u escapes and
// a surrogate pair (its unescaping path).
func BenchmarkDecodeRouteRequestStrings(b *testing.B) {
	body := []byte(`{"v":1,"request_id":"req-0123456789abcdef","model":"meta-llama/Llama-3.1-8B","token_ids":[1,2,3],` +
		`"session_id":"chat \"7f3a9c\"\n\u00e9\ud83d\ude00 and a longer plain tail","cache_salt":"salt\\with\/slashes",` +
		`"lora_name":"adapter-\u0041\t","allowed_workers":["worker-0001","worker-0002","worker-0003"],"expected_output_tokens":256}`)
	benchDecodeRouteRequest(b, body)
}

// benchDecodeRouteRequest decodes body into one reused request.
func benchDecodeRouteRequest(b *testing.B, body []byte) {
	var r RouteRequest
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset()
		if err := DecodeRouteRequest(body, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodingJSONRouteRequest2048(b *testing.B) {
	body := AppendRouteRequest(nil, request2048())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var r RouteRequest
		if err := json.Unmarshal(body, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func TestDecodeRouteResponse(t *testing.T) {
	for _, c := range []RouteResponse{
		{V: 1, RequestID: "r", Model: "m", Worker: "w", Rank: 3, Endpoint: "e", OverlapBlocks: 5, PromptBlocks: 9, Attempt: 1 << 40, Fence: "0123abcd", Replica: "x", QueueWaitUS: 77},
		{V: 1, RequestID: "r", Binding: &BindingInfo{SessionID: "s", Outcome: "created", Mode: "hard", Worker: "w", Rank: 2, HasRank: true, Version: 3}},
	} {
		var got RouteResponse
		if err := DecodeRouteResponse(AppendRouteResponse(nil, &c), &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("got %+v want %+v", got, c)
		}
	}
	var r RouteResponse
	if err := DecodeRouteResponse([]byte(`{"v":1,"binding":{"has_rank":maybe}}`), &r); err == nil {
		t.Fatal("bad literal accepted")
	}
}

// allowed_workers: absent or null allows every worker, a list names the
// eligible ones, an empty list is refused (it would allow none).
func TestAllowedWorkersAbsentNullList(t *testing.T) {
	for _, c := range []struct {
		body string
		want []string
	}{
		{`{"model":"m"}`, nil},
		{`{"model":"m","allowed_workers":null}`, nil},
		{`{"model":"m","allowed_workers":["a"]}`, []string{"a"}},
	} {
		var r RouteRequest
		if err := DecodeRouteRequest([]byte(c.body), &r); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if len(r.AllowedWorkers) != len(c.want) || (len(c.want) > 0 && r.AllowedWorkers[0] != c.want[0]) {
			t.Fatalf("%s: allowed %q, want %q", c.body, r.AllowedWorkers, c.want)
		}
	}
	var r RouteRequest
	err := DecodeRouteRequest([]byte(`{"model":"m","allowed_workers":[]}`), &r)
	var e *Error
	if !errors.As(err, &e) || e.Field != "allowed_workers" || !strings.Contains(e.Message, "at least one worker") {
		t.Fatalf("empty list: %v", err)
	}
}

// The lifecycle body has one decoder (encoding/json) for HTTP and NATS:
// an empty body has no fields, errors are bad_request naming the field.
func TestDecodeLifecycleRequest(t *testing.T) {
	lr := LifecycleRequest{Model: "keep"}
	if err := DecodeLifecycleRequest([]byte(" \n"), &lr); err != nil || lr.Model != "keep" {
		t.Fatalf("empty body: %v %+v", err, lr)
	}
	if err := DecodeLifecycleRequest([]byte(`{"request_id":"r","attempt":3,"fence":"f1","replica":"x"}`), &lr); err != nil ||
		lr != (LifecycleRequest{RequestID: "r", Model: "keep", Attempt: 3, Fence: "f1", Replica: "x"}) {
		t.Fatalf("decoded %+v, %v", lr, err)
	}
	for _, c := range []struct{ body, field string }{
		{`{"attempt":-1}`, "attempt"},
		{`{"request_id":5}`, "request_id"},
		{`[1]`, "body"},
		{`{"request_id":"r"`, "body"},
		{`{"request_id":"r"} {}`, "body"},
		{`{"request_id":"r"`, "body"},
		{strings.Repeat(" ", MaxLifecycleBodySize+1), "body"},
	} {
		var lr LifecycleRequest
		err := DecodeLifecycleRequest([]byte(c.body), &lr)
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeBadRequest || e.Field != c.field {
			t.Errorf("%.40q: %v, want bad_request on %s", c.body, err, c.field)
		}
	}
}

// The route answer is encoded once per routed request on both transports:
// the hand-written encoder stays only while it beats encoding/json here.
var benchResponse = RouteResponse{V: 1, RequestID: "r-1a2b3c", Model: "llama-3-70b", Worker: "worker-17", Rank: 3,
	Endpoint: "kvr.worker.llama-3-70b.worker-17.generate", OverlapBlocks: 64, PromptBlocks: 128, Attempt: 1, Replica: "r-x9",
	QueueWaitUS: 12, Binding: &BindingInfo{SessionID: "sess-42", Outcome: OutcomeFresh, Mode: "hard", Worker: "worker-17", Rank: 3, HasRank: true, Version: 7}}

func BenchmarkAppendRouteResponse(b *testing.B) {
	b.ReportAllocs()
	var buf []byte
	for i := 0; i < b.N; i++ {
		buf = AppendRouteResponse(buf[:0], &benchResponse)
	}
}

func BenchmarkEncodingJSONRouteResponse(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := json.Marshal(&benchResponse); err != nil {
			b.Fatal(err)
		}
	}
}

// The route answer is decoded by every client once per routed request,
// a lifecycle body by the replica once per free: each hand-written decoder
// stays only while it beats encoding/json here.
func BenchmarkDecodeRouteResponse(b *testing.B) {
	body := AppendRouteResponse(nil, &benchResponse)
	for _, c := range []struct {
		name   string
		decode func([]byte, *RouteResponse) error
	}{
		{"hand", DecodeRouteResponse},
		{"encoding-json", func(d []byte, r *RouteResponse) error { *r = RouteResponse{}; return json.Unmarshal(d, r) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var r RouteResponse
			for i := 0; i < b.N; i++ {
				if err := c.decode(body, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecodeLifecycleRequest(b *testing.B) {
	body := []byte(`{"request_id":"r-1a2b3c","model":"llama-3-70b","fence":"0123456789abcdef","replica":"r-x9","attempt":1}`)
	for _, c := range []struct {
		name   string
		decode func([]byte, *LifecycleRequest) error
	}{
		{"hand", DecodeLifecycleRequest},
		{"encoding-json", func(d []byte, r *LifecycleRequest) error { return json.Unmarshal(d, r) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var lr LifecycleRequest
				if err := c.decode(body, &lr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecodeErrorOnSuccess(b *testing.B) {
	body := AppendRouteResponse(nil, &benchResponse)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if DecodeError(body) != nil {
			b.Fatal("success body read as an error")
		}
	}
}
