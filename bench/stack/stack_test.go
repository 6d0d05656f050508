package stack

import (
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(testutil.IgnoredGoroutines(),
		// nats-server and the client library leave timers and flushers
		// that end shortly after shutdown.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func1"),
		goleak.IgnoreTopFunction("time.Sleep"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats.go.(*Conn).flusher"),
	)...)
}

// traceFile finds a Mooncake trace in ../shared/data/mooncake by walking up.
func traceFile(t *testing.T, name string) string {
	t.Helper()
	dir, _ := os.Getwd()
	for {
		for _, c := range []string{filepath.Join(dir, "shared", "data", "mooncake", name), filepath.Join(dir, "..", "shared", "data", "mooncake", name)} {
			if _, err := os.Stat(c); err == nil {
				return c
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skipf("%s not found (../shared/data/mooncake)", name)
		}
		dir = parent
	}
}

// checkOrdering asserts what must hold on any workload with prefix reuse.
// True-cache gets an allowance: both runs are real concurrent replays, and
// it chooses on the client with a load view one API call old, so a
// few requests can land differently by timing alone. On the 120-request
// synthetic replay under -race with the whole suite running three times in
// parallel, kvrouter came out ahead by up to 6.3 pp (a handful of requests
// missing a 64-block shared prefix); a broken true-cache (one that sees no
// cache) falls to round-robin's level, 30+ pp lower, and still fails.
func checkOrdering(t *testing.T, rep *report.Report, minGap float64) {
	t.Helper()
	kv, rr, or := rep.Policy("kvrouter"), rep.Policy("round-robin"), rep.Policy("true-cache")
	if kv == nil || rr == nil || or == nil {
		t.Fatalf("missing policies: %+v", rep.Policies)
	}
	for _, p := range rep.Policies {
		t.Logf("%-12s done %d/%d hit %.3f (bound %.3f) TTFT p50 %.0f p99 %.0f ms moved %d/%d route p50 %.2f p99 %.2f ms wall %.1fs", p.Policy, p.Done, p.Requests, p.HitRatio, p.UpperBound, p.TTFT.P50, p.TTFT.P99, p.SessionsMoved, p.Sessions, p.Route.P50, p.Route.P99, p.WallSeconds)
		if p.Done < p.Requests*9/10 {
			t.Errorf("%s: only %d of %d requests served (%v)", p.Policy, p.Done, p.Requests, p.Codes)
		}
	}
	if or.HitRatio < kv.HitRatio-0.08 {
		t.Errorf("true-cache hit %.3f below kvrouter's %.3f", or.HitRatio, kv.HitRatio)
	}
	if kv.HitRatio < rr.HitRatio+minGap {
		t.Errorf("kvrouter hit %.3f not clearly above round-robin's %.3f (+%.2f)", kv.HitRatio, rr.HitRatio, minGap)
	}
}

func checkFiles(t *testing.T, rep *report.Report) {
	t.Helper()
	dir := t.TempDir()
	files, err := rep.WriteAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(files.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var back report.Report
	if err := json.Unmarshal(data, &back); err != nil || len(back.Policies) != len(rep.Policies) {
		t.Fatalf("report.json: %v", err)
	}
	for _, c := range files.Charts {
		f, err := os.Open(c)
		if err != nil {
			t.Fatal(err)
		}
		_, err = png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
	if md, err := os.ReadFile(files.Markdown); err != nil || len(md) < 500 {
		t.Fatalf("report.md: %v (%d bytes)", err, len(md))
	}
}

func TestShortReplaySynthetic(t *testing.T) {
	// The client asks for what these 16-token replies need (max_tokens 32):
	// at the generators' default of 1,024, every request books 64 decode
	// blocks on these 4,096-block workers, all 120 arrive within 0.15 s of
	// wall time, and the decode threshold marks the cache holders busy
	// (kvrouter hit 0.48 in two runs; 0.51-0.66 in three at 32, under a
	// load average of 13-15).
	w := workload.SharedPrefix(workload.SharedPrefixConfig{Seed: 3, Groups: 24, PromptsPerGroup: 5, SystemTokens: 1024, QuestionTokens: 64, OutputTokens: 16, Rate: 40})
	pols, _ := replay.LookupPolicies([]string{"kvrouter,round-robin,true-cache"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := replay.Run(ctx, replay.Config{
		Workload: w, Policies: pols, NewStack: Factory(Options{}), Workers: 4, Speedup: 20, KVBlocks: 4096, MaxTokens: 32,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkOrdering(t, rep, 0.15)
	checkFiles(t, rep)
}

func TestShortReplayMooncake(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the whole conversation trace and replays it twice")
	}
	path := traceFile(t, "mooncake_fast25_conversation_trace.jsonl")
	full, err := workload.ReadMooncake(path, workload.ReadOptions{Sessions: true})
	if err != nil {
		t.Fatal(err)
	}
	// 60 multi-turn conversations (about 200 requests) keep the reuse
	// within sessions; squeeze their hour into two minutes of workload time.
	w := full.SampleSessions(60, 2, 1)
	load := w.Span().Seconds() / 120
	pols, _ := replay.LookupPolicies([]string{"kvrouter,round-robin,true-cache"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := replay.Run(ctx, replay.Config{
		Workload: w, Policies: pols, NewStack: Factory(Options{}), Workers: 4, Speedup: 50, LoadScale: load, MaxOutputTokens: 32,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("upper bound %.3f over %d requests", rep.Workload.UpperBound.Ratio, len(w.Requests))
	// With the whole suite sharing 2 cores, routes take hundreds of ms here
	// and kvrouter's lead over round-robin measured +0.109 to +0.144 (0.15
	// failed 2 runs in 3 under load; on a quiet machine it is about +0.2). A
	// cache-blind router lands at round-robin's level, so +0.07 still tells
	// them apart.
	checkOrdering(t, rep, 0.07)
	checkFiles(t, rep)

	// Hard sessions through two replicas: no session ever changes worker
	// (every worker stays alive).
	pols, _ = replay.LookupPolicies([]string{"kvrouter"})
	rep, err = replay.Run(ctx, replay.Config{
		Workload: w, Policies: pols, NewStack: Factory(Options{}), Workers: 4, Replicas: 2, Speedup: 50, LoadScale: load, MaxOutputTokens: 32,
		SessionMode: replay.SessionHard,
	})
	if err != nil {
		t.Fatal(err)
	}
	kv := rep.Policy("kvrouter")
	t.Logf("hard, 2 replicas: done %d/%d hit %.3f moved %d/%d codes %v", kv.Done, kv.Requests, kv.HitRatio, kv.SessionsMoved, kv.Sessions, kv.Codes)
	if kv.SessionsMoved != 0 || kv.Sessions != w.Sessions() {
		t.Errorf("Hard sessions moved: %d of %d (%d in the workload)", kv.SessionsMoved, kv.Sessions, w.Sessions())
	}
	// Two replicas: the stack measured how far their views drifted apart.
	if len(kv.Diagnostics) != 2 || !strings.Contains(kv.Diagnostics[0], "booked requests the two replicas disagree on") {
		t.Errorf("diagnostics of two replicas: %q", kv.Diagnostics)
	}
	t.Logf("diagnostics: %q", kv.Diagnostics)
}

// A replica's predicted index follows the policy: the host's default TTL,
// or the policy's own, scaled by the speed-up, or off for a negative one
// (a peer without predict-on-route, such as Dynamo by default).
func TestReplicaPredictedTTL(t *testing.T) {
	for _, tc := range []struct {
		policy  time.Duration
		speedup float64
		want    time.Duration
	}{
		{0, 1, 5 * time.Second},
		{0, 10, 500 * time.Millisecond},
		{2 * time.Second, 2, time.Second},
		{-1, 1, -1},
		{-1, 10, -1},
	} {
		s := &Stack{cfg: replay.StackConfig{Policy: replay.Policy{RouterPolicy: "default", PredictedTTL: tc.policy}, Speedup: tc.speedup, Model: "m", BlockSize: 16}}
		if got := s.replicaConfig(0).PredictedTTL; got != tc.want {
			t.Errorf("policy TTL %v at speed-up %g: replica TTL %v, want %v", tc.policy, tc.speedup, got, tc.want)
		}
	}
}
