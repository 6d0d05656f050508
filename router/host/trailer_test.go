package host

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
)

// A route request whose token ids come in the token trailer routes as the
// same request with them in the JSON, over NATS and over HTTP: same prompt
// blocks, and the second sees the first's prompt as booked. A malformed
// trailer is a 400 naming token_ids, and the replica goes on routing.
func TestTokenTrailerRoutes(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	r := st.replicas[0]
	toks := tokens(21, 64)
	want := len(toks) / DefaultBlockSize
	req := &api.RouteRequest{Model: testModel, TokenIDs: toks, ExpectedOutputTokens: 4}

	route := func(name string, body []byte, viaHTTP bool) (int, *api.RouteResponse, *api.Error) {
		t.Helper()
		var code int
		var data []byte
		if viaHTTP {
			code, data = httpDo(t, "POST", "http://"+r.HTTPAddr()+"/v1/route", body)
		} else {
			reply, err := st.nc.Request(api.RouteSubject("", testModel), body, 5*time.Second)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			code, data = 200, reply.Data
			if st := reply.Header.Get(api.HeaderStatus); st != "" {
				code, _ = strconv.Atoi(st)
			}
		}
		if e := api.DecodeError(data); e != nil {
			return code, nil, e
		}
		var resp api.RouteResponse
		if err := api.DecodeRouteResponse(data, &resp); err != nil {
			t.Fatalf("%s: %v (%s)", name, err, data)
		}
		return code, &resp, nil
	}

	// The JSON form first, until its prompt is recorded (asynchronously)
	// as cached on the worker it chose: then a route of the same ids finds
	// every block. Each trailer form is routed once after it, so a full
	// overlap means it read the very ids the JSON gave.
	var got api.RouteResponse
	testutil.Eventually(t, 10*time.Second, func() bool {
		code, resp, e := route("NATS, JSON", api.AppendRouteRequest(nil, req), false)
		if e != nil || code != 200 {
			t.Fatalf("NATS, JSON: %d %v", code, e)
		}
		got = *resp
		return resp.PromptBlocks == want && resp.OverlapBlocks == want
	}, func() string {
		return fmt.Sprintf("NATS, JSON: overlap %d of %d blocks, want all %d", got.OverlapBlocks, got.PromptBlocks, want)
	})
	for _, c := range []struct {
		name    string
		viaHTTP bool
	}{{"NATS, trailer", false}, {"HTTP, trailer", true}} {
		code, resp, e := route(c.name, api.AppendRouteBody(nil, req), c.viaHTTP)
		if e != nil || code != 200 {
			t.Fatalf("%s: %d %v", c.name, code, e)
		}
		if resp.PromptBlocks != want || resp.OverlapBlocks != want {
			t.Fatalf("%s: overlap %d of %d blocks, want all %d", c.name, resp.OverlapBlocks, resp.PromptBlocks, want)
		}
	}

	ragged := api.AppendRouteBody(nil, req)
	ragged = ragged[:len(ragged)-1]
	twice := append(api.AppendRouteRequest(nil, req), append([]byte{api.TokenTrailerMark}, 1, 0, 0, 0)...)
	for _, c := range []struct {
		name string
		body []byte
	}{{"ragged trailer", ragged}, {"token ids twice", twice}} {
		for _, viaHTTP := range []bool{false, true} {
			code, _, e := route(c.name, c.body, viaHTTP)
			if code != 400 || e == nil || e.Field != "token_ids" {
				t.Fatalf("%s (HTTP %v): %d %+v, want 400 on token_ids", c.name, viaHTTP, code, e)
			}
		}
	}
	if _, err := st.client.Route(ctxT(t), req); err != nil {
		t.Fatalf("after the bad bodies: %v", err)
	}
}
