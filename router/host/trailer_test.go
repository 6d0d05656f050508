package host

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/api"
)

// A route request whose token ids, or block hashes, come in a binary
// trailer routes as the same request with them in the JSON, over NATS and
// over HTTP: same prompt blocks, and the second sees the first's prompt as
// booked. A malformed trailer is a 400 naming the field, and the replica
// goes on routing.
func TestBinaryTrailersRoute(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	r := st.replicas[0]

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

	for i, form := range []struct {
		name  string
		field string
		mark  byte
		size  int // bytes a value in the trailer
	}{{"token ids", "token_ids", api.TokenTrailerMark, 4}, {"block hashes", "block_hashes", api.HashTrailerMark, 8}} {
		toks := tokens(21+i, 64)
		want := len(toks) / DefaultBlockSize
		req := &api.RouteRequest{Model: testModel, TokenIDs: toks, ExpectedOutputTokens: 4}
		if form.mark == api.HashTrailerMark {
			hashed := req.AsBlockHashes(DefaultBlockSize)
			req = &hashed
		}

		// The JSON form first, until its prompt is recorded
		// (asynchronously) as cached on the worker it chose: then a route
		// of the same prompt finds every block. Each trailer form is routed
		// once after it, so a full overlap means it read the very values
		// the JSON gave.
		var got api.RouteResponse
		testutil.Eventually(t, 10*time.Second, func() bool {
			code, resp, e := route(form.name+", NATS, JSON", api.AppendRouteRequest(nil, req), false)
			if e != nil || code != 200 {
				t.Fatalf("%s, NATS, JSON: %d %v", form.name, code, e)
			}
			got = *resp
			return resp.PromptBlocks == want && resp.OverlapBlocks == want
		}, func() string {
			return fmt.Sprintf("%s, NATS, JSON: overlap %d of %d blocks, want all %d", form.name, got.OverlapBlocks, got.PromptBlocks, want)
		})
		body := api.AppendRouteBody(nil, req)
		if m := body[len(body)-1-form.size*(len(req.TokenIDs)+len(req.BlockHashes))]; m != form.mark {
			t.Fatalf("%s: the body's mark is %#x, want %#x", form.name, m, form.mark)
		}
		for _, viaHTTP := range []bool{false, true} {
			code, resp, e := route(form.name, body, viaHTTP)
			if e != nil || code != 200 {
				t.Fatalf("%s (HTTP %v): %d %v", form.name, viaHTTP, code, e)
			}
			if resp.PromptBlocks != want || resp.OverlapBlocks != want {
				t.Fatalf("%s (HTTP %v): overlap %d of %d blocks, want all %d", form.name, viaHTTP, resp.OverlapBlocks, resp.PromptBlocks, want)
			}
		}

		ragged := body[:len(body)-1]
		twice := append(api.AppendRouteRequest(nil, req), form.mark)
		twice = append(twice, make([]byte, form.size)...)
		for _, c := range []struct {
			name string
			body []byte
		}{{"ragged trailer", ragged}, {"given twice", twice}} {
			for _, viaHTTP := range []bool{false, true} {
				code, _, e := route(c.name, c.body, viaHTTP)
				if code != 400 || e == nil || e.Field != form.field {
					t.Fatalf("%s, %s (HTTP %v): %d %+v, want 400 on %s", form.name, c.name, viaHTTP, code, e, form.field)
				}
			}
		}
		if _, err := st.client.Route(ctxT(t), req); err != nil {
			t.Fatalf("%s: after the bad bodies: %v", form.name, err)
		}
	}
}
