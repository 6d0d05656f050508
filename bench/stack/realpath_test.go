package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/router/host"
)

// The real path's index is fed by the engines' KV events (ZMQ, bridge,
// JetStream), not only by the replica's own decisions: with the predicted
// index off, a prompt an engine has served is found in the index and a
// repeat of it reports the engine's cached blocks as its overlap. (The
// engines' PUB endpoints once had a loopback host, which by vLLM's rule
// connects instead of binding, so no event ever reached a bridge and the
// replay's gateway rows routed on their own decisions alone.)
func TestRealIndexFedByEngineEvents(t *testing.T) {
	const bs = 64
	hc := host.Config{ReplicaID: "real-0", Models: []string{"m"}, BlockSize: bs, PredictedTTL: -1, DecisionSyncBuffer: -1,
		Logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := StartReal(ctx, RealConfig{Model: "m", Engines: 2, KVBlocks: 256, BlockSize: bs, Speedup: 10,
		IDPrefix: "w", Replicas: []host.Config{hc}, Registry: registryConfig(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	prompt := make([]uint32, 10*bs+7)
	for i := range prompt {
		prompt[i] = uint32(i*7919%30000 + 1)
	}
	complete := func() (worker string, overlap int) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 2})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.GatewayURL+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %s: %s", resp.Status, b)
		}
		overlap, _ = strconv.Atoi(resp.Header.Get(gateway.HeaderOverlapBlocks))
		return resp.Header.Get(gateway.HeaderWorker), overlap
	}
	served, _ := complete()
	indexed := func() int {
		w, err := r.replicas[0].Workers("m")
		if err != nil {
			return -1
		}
		n := 0
		for _, ws := range w.Workers {
			if ws.Worker+"#0" == served || ws.Worker == served {
				n += ws.IndexedBlocks
			}
		}
		return n
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return indexed() >= 10 }, func() string {
		return fmt.Sprintf("the index holds %d blocks of %s, which served a 10-block prompt: its KV events never arrived", indexed(), served)
	})
	if w, overlap := complete(); w != served || overlap < 10 {
		t.Errorf("the repeat went to %s with overlap %d, want %s with the prompt's 10 blocks", w, overlap, served)
	}
}
