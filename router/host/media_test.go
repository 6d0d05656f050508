package host

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
)

// Media items enter the route's hashes: a prompt routed with an image is
// recorded (predicted index) under hashes that a second prompt with the
// same tokens matches only with the same image, and only up to the image's
// first block with another one; an item whose identifier is unknown cuts
// the prompt blocks to those before it; malformed items are refused.
func TestRouteHashesMediaItems(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	r := st.replicas[0]
	ctx := ctxT(t)
	toks := tokens(7, 128) // 8 blocks
	route := func(id string) *api.RouteResponse {
		t.Helper()
		var resp api.RouteResponse
		req := &api.RouteRequest{Model: testModel, TokenIDs: toks, Media: []kvevents.MediaItem{{ID: id, Offset: 40, Length: 30}}}
		if err := r.Route(ctx, req, &resp); err != nil {
			t.Fatal(err)
		}
		if err := r.freeLocal(ctx, &resp); err != nil {
			t.Fatal(err)
		}
		return &resp
	}
	if got := route("cat"); got.PromptBlocks != 8 || got.OverlapBlocks != 0 {
		t.Fatalf("first route: %d/%d blocks", got.OverlapBlocks, got.PromptBlocks)
	}
	// The predicted index records a route asynchronously.
	got := 0
	testutil.Eventually(t, 10*time.Second, func() bool { got = route("cat").OverlapBlocks; return got == 8 },
		func() string { return fmt.Sprintf("same image: overlap %d, want 8", got) })
	// Block 2 ([32, 48)) holds the image's first placeholders.
	if got := route("dog"); got.OverlapBlocks != 2 || got.PromptBlocks != 8 {
		t.Fatalf("another image: overlap %d/%d, want 2/8", got.OverlapBlocks, got.PromptBlocks)
	}
	if got := route(""); got.OverlapBlocks != 2 || got.PromptBlocks != 2 {
		t.Fatalf("unknown identifier: overlap %d/%d, want 2/2", got.OverlapBlocks, got.PromptBlocks)
	}
	var resp api.RouteResponse
	err := r.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: toks, Media: []kvevents.MediaItem{{ID: "x", Offset: 120, Length: 30}}}, &resp)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Field != "media" {
		t.Fatalf("an item past the prompt: %v", err)
	}
}

// freeLocal frees a booking of this replica.
func (r *Replica) freeLocal(ctx context.Context, resp *api.RouteResponse) error {
	_, err := r.Lifecycle(ctx, api.OpFree, &api.LifecycleRequest{V: api.APIVersion, RequestID: resp.RequestID, Model: testModel,
		Attempt: resp.Attempt, Fence: resp.Fence, Replica: resp.Replica})
	return err
}

// Over a NATS server whose max_payload is smaller than a prompt's token
// ids, the route API client sends the prompt's block hashes instead (with
// a block size), and the replica routes it as it routes the token ids:
// same prompt blocks, same overlap. With no block size the client refuses
// it before sending.
func TestClientSendsBlockHashesPastMaxPayload(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1, maxPayload: 64 << 10})
	st.waitWorkers(1)
	ctx := ctxT(t)
	toks := tokens(9, 20_000) // 80 KB of token ids in the token trailer
	if n := len(api.AppendRouteBody(nil, &api.RouteRequest{Model: testModel, TokenIDs: toks})); n <= st.client.MaxRouteBody() {
		t.Fatalf("the token form is %d bytes, under the limit %d: the test would not cover the hash form", n, st.client.MaxRouteBody())
	}
	first, err := st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: toks, BlockSize: DefaultBlockSize, ExpectedOutputTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(toks) / DefaultBlockSize; first.PromptBlocks != want || first.OverlapBlocks != 0 {
		t.Fatalf("first route: %d/%d blocks, want 0/%d", first.OverlapBlocks, first.PromptBlocks, want)
	}
	if err := st.client.Free(ctx, testModel, first); err != nil {
		t.Fatal(err)
	}
	// In process (no NATS limit) with token ids: the replica's own hashes
	// match what the client sent, once the predicted index has recorded
	// the first route (asynchronously).
	got := 0
	testutil.Eventually(t, 10*time.Second, func() bool {
		var again api.RouteResponse
		if err := st.replicas[0].Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: toks}, &again); err != nil {
			t.Fatal(err)
		}
		if err := st.replicas[0].freeLocal(ctx, &again); err != nil {
			t.Fatal(err)
		}
		got = again.OverlapBlocks
		return got == first.PromptBlocks
	}, func() string {
		return fmt.Sprintf("token ids after block hashes: overlap %d, want %d", got, first.PromptBlocks)
	})
	_, err = st.client.Route(ctx, &api.RouteRequest{Model: testModel, TokenIDs: toks})
	if !errors.Is(err, api.ErrPayloadTooLarge) {
		t.Fatalf("without block_size: %v, want payload_too_large", err)
	}
}
