package host

import (
	"errors"
	"testing"

	"github.com/kvrouter/kvrouter/router/api"
)

// The per-request session mode: it sets the mode of the binding the request
// creates; the mode stored in an existing binding wins over a later
// request's; "" is the replica's default (Hard here).
func TestPerRequestSessionMode(t *testing.T) {
	st := startStack(t, stackOpts{workers: 2, replicas: 1})
	st.waitWorkers(2)
	r := st.replicas[0]
	ctx := ctxT(t)
	route := func(session, mode string) (*api.RouteResponse, error) {
		var resp api.RouteResponse
		err := r.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: tokens(1, 64), SessionID: session, SessionMode: mode}, &resp)
		if err == nil {
			if ferr := st.client.Free(ctx, testModel, &resp); ferr != nil {
				t.Fatalf("free: %v", ferr)
			}
		}
		return &resp, err
	}
	cases := []struct{ name, session, first, next, want string }{
		{"default", "s-default", "", "", "hard"},
		{"request soft", "s-soft", "soft", "", "soft"},
		{"stored soft wins", "s-soft2", "soft", "hard", "soft"},
		{"stored hard wins", "s-hard", "hard", "soft", "hard"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i, mode := range []string{c.first, c.next} {
				resp, err := route(c.session, mode)
				if err != nil || resp.Binding == nil || resp.Binding.Mode != c.want {
					t.Fatalf("request %d (mode %q): %+v, %v; want binding mode %q", i, mode, resp.Binding, err, c.want)
				}
			}
		})
	}
	if _, err := route("s-bad", "firm"); !errors.Is(err, api.ErrBadRequest) {
		t.Fatalf("mode firm: %v, want bad_request", err)
	}
}

// A request with input_tokens and no prompt routes on load alone (what the
// gateway sends when the engine's tokenizer could not be asked).
func TestRouteOnLoadAlone(t *testing.T) {
	st := startStack(t, stackOpts{workers: 2, replicas: 1})
	st.waitWorkers(2)
	ctx := ctxT(t)
	var resp api.RouteResponse
	if err := st.replicas[0].Route(ctx, &api.RouteRequest{Model: testModel, InputTokens: 100}, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Worker == "" || resp.OverlapBlocks != 0 || resp.PromptBlocks != 0 {
		t.Fatalf("%+v", resp)
	}
	if err := st.client.Free(ctx, testModel, &resp); err != nil {
		t.Fatal(err)
	}
}
