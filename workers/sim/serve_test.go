package sim

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/nats-io/nats.go"
)

// serveEngine runs e (Run) and serves it on a fresh embedded server.
func serveEngine(t *testing.T, e *Engine) (*nats.Conn, *Server) {
	t.Helper()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	srv, err := Serve(ctx, nc, e)
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return nc, srv
}

func closeMs(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestServeRoundTrip(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{Model: "llama-3/8b", Worker: "sim.0"})
	nc, srv := serveEngine(t, e)
	if e.Endpoint() != "kvr.worker.llama-3/8b.sim%2E0.generate" {
		t.Fatalf("endpoint %q", e.Endpoint())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	req := &GenerateRequest{RequestID: "r1", TokenIDs: seq(1, 300), MaxTokens: 5}
	var got []uint32
	fin, err := Generate(ctx, nc, e.Endpoint(), req, func(c *GenerateReply) {
		if c.RequestID != "r1" || c.Index != len(got) {
			t.Errorf("chunk %+v after %d tokens", c, len(got))
		}
		got = append(got, c.TokenIDs...)
	})
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if len(got) != 5 || got[4] != mixToken(outputSeed("r1"), 4) {
		t.Fatalf("tokens %v", got)
	}
	m := DefaultTiming()
	if !fin.Done || fin.FinishReason != FinishLength || fin.PromptTokens != 300 || fin.OutputTokens != 5 || fin.CachedTokens != 0 ||
		fin.Worker != "sim.0" || !closeMs(fin.TTFTMs, m.PrefillMs(300)) || fin.ITLMs <= 0 || fin.E2EMs <= fin.TTFTMs {
		t.Fatalf("final %+v (want ttft %.6f)", fin, m.PrefillMs(300))
	}

	// Mooncake-style block ids; the second request shares the first block.
	r2 := &GenerateRequest{RequestID: "m1", BlockIDs: []uint64{0, 1, 2}, InputLength: 1200, MaxTokens: 1}
	if fin, err = Generate(ctx, nc, e.Endpoint(), r2, nil); err != nil || fin.PromptTokens != 1200 || !closeMs(fin.TTFTMs, m.PrefillMs(1200)) {
		t.Fatalf("block ids: %+v %v", fin, err)
	}
	r3 := &GenerateRequest{RequestID: "m2", BlockIDs: []uint64{0, 5}, MaxTokens: 1}
	if fin, err = Generate(ctx, nc, e.Endpoint(), r3, nil); err != nil || fin.CachedTokens != 512 || !closeMs(fin.TTFTMs, m.PrefillMs(512)) {
		t.Fatalf("shared block: %+v %v", fin, err)
	}
	if st := srv.Stats(); st.Requests != 3 || st.BadRequests != 0 || st.PublishErrors != 0 {
		t.Fatalf("server stats %+v", st)
	}
}

func TestServeErrors(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{KVBlocks: 100})
	nc, srv := serveEngine(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := []struct {
		name string
		req  GenerateRequest
		code string
	}{
		{"empty prompt", GenerateRequest{RequestID: "a", MaxTokens: 1}, CodeBadRequest},
		{"both prompts", GenerateRequest{RequestID: "b", TokenIDs: seq(1, 3), BlockIDs: []uint64{1}, MaxTokens: 1}, CodeBadRequest},
		{"max tokens", GenerateRequest{RequestID: "c", TokenIDs: seq(1, 3)}, CodeBadRequest},
		{"input length too short for ids", GenerateRequest{RequestID: "d", BlockIDs: []uint64{1, 2}, InputLength: 512, MaxTokens: 1}, CodeBadRequest},
		{"input length too long for ids", GenerateRequest{RequestID: "e", BlockIDs: []uint64{1, 2}, InputLength: 1025, MaxTokens: 1}, CodeBadRequest},
		{"block tokens", GenerateRequest{RequestID: "f", BlockIDs: []uint64{1}, BlockTokens: -3, MaxTokens: 1}, CodeBadRequest},
		{"does not fit", GenerateRequest{RequestID: "g", TokenIDs: seq(1, 2000), MaxTokens: 1}, CodeTooLong},
		{"bad rank", GenerateRequest{RequestID: "h", TokenIDs: seq(1, 3), MaxTokens: 1, Rank: 4}, CodeBadRequest},
		{"bomb", GenerateRequest{RequestID: "i", BlockIDs: make([]uint64, 9000), MaxTokens: 1}, CodeTooLong},
	}
	for _, tt := range tests {
		fin, err := Generate(ctx, nc, e.Endpoint(), &tt.req, nil)
		var re *RemoteError
		if !errors.As(err, &re) || re.Code != tt.code || fin == nil || fin.Code != tt.code || !fin.Done {
			t.Errorf("%s: err %v fin %+v, want code %s", tt.name, err, fin, tt.code)
		}
	}

	// Undecodable body: the worker still answers on the reply subject.
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(e.Endpoint(), inbox, []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var fin GenerateReply
	if err := json.Unmarshal(m.Data, &fin); err != nil || !fin.Done || fin.Code != CodeBadRequest {
		t.Fatalf("garbage: %s (%v)", m.Data, err)
	}
	// No reply subject: counted and dropped.
	if err := nc.Publish(e.Endpoint(), []byte(`{"request_id":"x","token_ids":[1],"max_tokens":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.Stats().BadRequests != uint64(len(tests))+2 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", srv.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}

	if _, err := Generate(ctx, nc, "kvr.worker.m.nobody.generate", &GenerateRequest{RequestID: "z", TokenIDs: seq(1, 3), MaxTokens: 1}, nil); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("no worker: %v", err)
	}
}

// Stop cancels requests in flight; their clients get a final "cancelled".
func TestServeStopCancelsInFlight(t *testing.T) {
	e, _, _ := newTestEngine(t, Config{Clock: WallClock{}})
	nc, srv := serveEngine(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		n := 0
		// ~6 ms per decode step in real time: 100,000 tokens never finish.
		_, err := Generate(ctx, nc, e.Endpoint(), &GenerateRequest{RequestID: "long", TokenIDs: seq(1, 32), MaxTokens: 100000}, func(*GenerateReply) {
			if n++; n == 1 {
				close(first)
			}
		})
		errc <- err
	}()
	select {
	case <-first:
	case <-ctx.Done():
		t.Fatal("no first chunk")
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	var re *RemoteError
	if err := <-errc; !errors.As(err, &re) || re.Code != CodeCancelled {
		t.Fatalf("client got %v, want code cancelled", err)
	}
	// The engine drops the request at its next step.
	deadline := time.Now().Add(5 * time.Second)
	for e.InFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("request still in flight after Stop")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func FuzzGenerateRequest(f *testing.F) {
	f.Add([]byte(`{"request_id":"r","token_ids":[1,2,3],"max_tokens":4}`))
	f.Add([]byte(`{"request_id":"m","block_ids":[0,1,2],"input_length":1200,"max_tokens":1}`))
	f.Add([]byte(`{"block_ids":[0],"block_tokens":65536,"input_length":1}`))
	f.Add([]byte(`{"block_ids":[1,2],"input_length":-5}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req GenerateRequest
		if err := json.Unmarshal(data, &req); err != nil {
			return
		}
		toks, err := req.Tokens()
		if err != nil {
			return
		}
		if len(toks) == 0 || len(toks) > MaxRequestTokens {
			t.Fatalf("%d tokens accepted", len(toks))
		}
		if len(req.BlockIDs) > 0 && req.InputLength > 0 && len(toks) != req.InputLength {
			t.Fatalf("%d tokens for input_length %d", len(toks), req.InputLength)
		}
	})
}
