package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/router/scheduler"
)

func smallWorkload() *workload.Workload {
	return workload.SharedPrefix(workload.SharedPrefixConfig{Seed: 1, Groups: 8, PromptsPerGroup: 8, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 8, Rate: 2000})
}

func TestRunWithFakeStack(t *testing.T) {
	var stacks []*fakeStack
	w := smallWorkload()
	pols, _ := LookupPolicies(append(DefaultPolicies, "true-cache"))
	rep, err := Run(context.Background(), Config{
		Workload: w, Policies: pols, NewStack: newFakeFactory(&stacks, 0), Workers: 4, Speedup: 1000, MaxInFlight: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Policies) != len(pols) || len(stacks) != len(pols) {
		t.Fatalf("%d policies, %d stacks", len(rep.Policies), len(stacks))
	}
	for _, s := range stacks {
		if s.routes.Load() != int64(len(w.Requests)) || s.prefills.Load() != s.routes.Load() || s.frees.Load() != s.routes.Load() {
			t.Fatalf("%s: routes %d prefills %d frees %d", s.cfg.Policy.Name, s.routes.Load(), s.prefills.Load(), s.frees.Load())
		}
		if s.cfg.Policy.TrueCache != (s.pins.Load() == s.routes.Load()) || (!s.cfg.Policy.TrueCache && s.pins.Load() != 0) {
			t.Fatalf("%s: %d pins", s.cfg.Policy.Name, s.pins.Load())
		}
		if s.sessions.Load() != 0 {
			t.Fatal("sessions sent in mode none")
		}
		if s.cfg.BlockSize != 16 || s.cfg.KVBlocks != 65536 {
			t.Fatalf("defaults: %+v", s.cfg)
		}
	}
	kv, rr, or := rep.Policy("kvrouter"), rep.Policy("round-robin"), rep.Policy("true-cache")
	t.Logf("hit: kvrouter %.3f round-robin %.3f true-cache %.3f bound %.3f", kv.HitRatio, rr.HitRatio, or.HitRatio, rep.Workload.UpperBound.Ratio)
	if kv.Done != len(w.Requests) || kv.HitRatio <= rr.HitRatio+0.1 || or.HitRatio < kv.HitRatio-1e-9 || kv.HitRatio > rep.Workload.UpperBound.Ratio+1e-9 {
		t.Fatal("ordering does not hold")
	}
	if rep.Unloaded == nil || rep.Unloaded.P50 <= 0 || len(rep.Checks) < 3 {
		t.Fatalf("unloaded %+v checks %+v", rep.Unloaded, rep.Checks)
	}
	if _, err := rep.WriteAll(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

func TestRunSessionsAndRejections(t *testing.T) {
	var stacks []*fakeStack
	w := workload.Chat(workload.ChatConfig{Seed: 2, Sessions: 6, Turns: 3, SystemTokens: 256, UserTokens: 32, OutputTokens: 8, SessionRate: 100})
	pols, _ := LookupPolicies([]string{"kvrouter,true-cache"})
	var records bytes.Buffer
	rep, err := Run(context.Background(), Config{Workload: w, NewStack: newFakeFactory(&stacks, 5), Policies: pols, Workers: 2, Speedup: 1e5, SessionMode: SessionHard, LoadScale: 2, Records: &records})
	if err != nil {
		t.Fatal(err)
	}
	kv := rep.Policy("kvrouter")
	if kv.Rejected == 0 || kv.Codes["overloaded"] != kv.Rejected || kv.Done+kv.Rejected != len(w.Requests) {
		t.Fatalf("%+v", kv)
	}
	// Records: one JSON line per request and policy, agreeing with the report.
	byPolicy := map[string]map[string]int{}
	for dec := json.NewDecoder(&records); dec.More(); {
		var l metrics.RecordLine
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		if l.Path != PathNATS || l.ID == "" || l.Session == "" || (l.Outcome == "done") != (l.Worker != "") || l.TTFTMS < 0 {
			t.Fatalf("record %+v", l)
		}
		if byPolicy[l.Policy] == nil {
			byPolicy[l.Policy] = map[string]int{}
		}
		byPolicy[l.Policy][l.Outcome+"/"+l.Code]++
	}
	if got := byPolicy["kvrouter"]; len(byPolicy) != 2 || got["done/"] != kv.Done || got["rejected/overloaded"] != kv.Rejected {
		t.Fatalf("records by policy and outcome %v, report %d done %d rejected", byPolicy, kv.Done, kv.Rejected)
	}
	if stacks[0].sessions.Load() != int64(len(w.Requests)) || stacks[1].sessions.Load() != 0 {
		t.Fatalf("sessions sent: %d, true-cache %d", stacks[0].sessions.Load(), stacks[1].sessions.Load())
	}
	if rep.Workload.LoadScale != 2 || rep.Workload.Stats.SpanSeconds*2 > w.Span().Seconds()+0.01 {
		t.Fatalf("load scale not applied: %+v vs %v", rep.Workload.Stats, w.Span())
	}
	found := false
	for _, c := range rep.Checks {
		found = found || c.Name == "Hard sessions never move while their worker is alive"
	}
	if !found {
		t.Fatal("no session check")
	}
}

// The peers run as their authors run them: their own admission (none
// queues in the router, whatever the run's threshold), when the run sends
// session ids their own affinity (llm-d soft, Dynamo hard, SGLang's
// cache_aware and KubeAI's PrefixHash none), and their own predict-on-route
// (llm-d's and SGLang's indexes take a prompt in as they route it; Dynamo's
// --router-predicted-ttl-secs is unset by default; KubeAI has no index);
// kvrouter keeps the run's, and dynamo-predicted names its own TTL.
// Every route carries its conversation's id as the routing key (chwbl's
// first user message).
func TestPeersRunWithTheirOwnAdmissionAndAffinity(t *testing.T) {
	var stacks []*fakeStack
	w := workload.Chat(workload.ChatConfig{Seed: 3, Sessions: 4, Turns: 2, SystemTokens: 256, UserTokens: 32, OutputTokens: 8, SessionRate: 100})
	pols, err := LookupPolicies([]string{"kvrouter,peers,dynamo-predicted"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), Config{Workload: w, NewStack: newFakeFactory(&stacks, 0), Policies: pols,
		Workers: 2, Speedup: 1e5, SessionMode: SessionSoft, QueueThreshold: 8})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		threshold float64
		sessions  SessionMode
		predicted time.Duration
	}{
		"kvrouter": {8, SessionSoft, 0}, "llmd": {-1, SessionSoft, 5 * time.Second}, "dynamo": {-1, SessionHard, -1},
		"sglang": {-1, SessionNone, 5 * time.Second}, "chwbl": {-1, SessionNone, -1},
		"dynamo-predicted": {-1, SessionHard, 5 * time.Second},
	}
	n := int64(len(w.Requests))
	for _, s := range stacks {
		name := s.cfg.Policy.Name
		wt, ok := want[name]
		if !ok {
			t.Fatalf("unexpected policy %s", name)
		}
		if s.cfg.QueueThreshold != wt.threshold || s.cfg.SessionMode != wt.sessions || s.cfg.Policy.PredictedTTL != wt.predicted {
			t.Errorf("%s: threshold %g, sessions %s, predicted TTL %v; want %g, %s, %v", name,
				s.cfg.QueueThreshold, s.cfg.SessionMode, s.cfg.Policy.PredictedTTL, wt.threshold, wt.sessions, wt.predicted)
		}
		if sent := s.sessions.Load(); (wt.sessions == SessionNone) != (sent == 0) || (sent != 0 && sent != n) {
			t.Errorf("%s: %d of %d routes carried a session id", name, sent, n)
		}
		if s.routingKeys.Load() != n {
			t.Errorf("%s: %d of %d routes carried a routing key", name, s.routingKeys.Load(), n)
		}
	}
	notes := 0
	for _, note := range rep.Notes {
		if strings.Contains(note, "ran as its authors run it") {
			notes++
		}
		if strings.HasPrefix(note, "dynamo ran") && !strings.Contains(note, "no predict-on-route index") {
			t.Errorf("dynamo's note does not say it ran without a predict-on-route index: %q", note)
		}
		if strings.HasPrefix(note, "dynamo-predicted ran") && !strings.Contains(note, "but for its predict-on-route index, set here: no router queue, a predict-on-route index of 5s") {
			t.Errorf("dynamo-predicted's note does not say its predict-on-route index departs from Dynamo's default: %q", note)
		}
	}
	if notes != 5 {
		t.Fatalf("%d peer notes, want 5: %q", notes, rep.Notes)
	}
	// Without sessions in the run, no peer gets any.
	stacks = nil
	if _, err := Run(context.Background(), Config{Workload: w, NewStack: newFakeFactory(&stacks, 0), Policies: pols, Workers: 2, Speedup: 1e5}); err != nil {
		t.Fatal(err)
	}
	for _, s := range stacks {
		if s.sessions.Load() != 0 || s.cfg.SessionMode != SessionNone {
			t.Errorf("%s: sessions sent in mode none", s.cfg.Policy.Name)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	w := smallWorkload()
	var stacks []*fakeStack
	f := newFakeFactory(&stacks, 0)
	for _, c := range []Config{
		{NewStack: f},
		{Workload: w},
		{Workload: w, NewStack: f, Workers: -1},
		{Workload: w, NewStack: f, Speedup: -1},
		{Workload: w, NewStack: f, SessionMode: "sticky"},
		{Workload: &workload.Workload{BlockTokens: 512, Requests: w.Requests}, NewStack: f, BlockSize: 48},
	} {
		if _, err := Run(context.Background(), c); !errors.Is(err, ErrConfig) {
			t.Fatalf("%+v: %v", c, err)
		}
	}
	if _, err := LookupPolicies([]string{"kvrouter,nope"}); !errors.Is(err, ErrConfig) {
		t.Fatal(err)
	}
	if ps, err := LookupPolicies([]string{"all", "true-cache"}); err != nil || len(ps) != len(Catalog) {
		t.Fatal(ps, err)
	}
	if m, err := ParseSessionMode("HARD"); err != nil || m != SessionHard {
		t.Fatal(m, err)
	}
}

func TestRunCancelled(t *testing.T) {
	var stacks []*fakeStack
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Config{Workload: smallWorkload(), NewStack: newFakeFactory(&stacks, 0)}); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// The catalog's parameterised entry builds in the scheduler's registry with
// its parameter applied.
func TestCatalogParams(t *testing.T) {
	p, ok := policyByName("kvrouter-credit2")
	if !ok {
		t.Fatal("kvrouter-credit2 not in the catalog")
	}
	pol, err := scheduler.NewRegistry().Build(scheduler.PolicyConfig{Name: p.RouterPolicy, Params: p.RouterParams})
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := pol.(*scheduler.DefaultPolicy); !ok || d.Cost.OverlapCredit != 2 {
		t.Fatalf("built %T %+v", pol, pol)
	}
	for _, n := range append([]string{"peers"}, PeerPolicies...) {
		if _, err := LookupPolicies([]string{n}); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// Three runs fold into their medians with the lowest and highest beside
// them, every table figure included; the charts' data comes from the run
// with the median p99.
func TestMedianOfRuns(t *testing.T) {
	var sums []metrics.Summary
	queue := []float64{5, 9, 1} // the median-p99 run (the third) has neither median
	moved := []int{20, 30, 10}
	for i, v := range []float64{300, 100, 200} {
		s := metrics.Summary{Policy: "kvrouter", HitRatio: v / 1000, UpperBound: 0.5, WallSeconds: float64(i), SessionsMoved: moved[i]}
		s.TTFT.P50, s.TTFT.P99, s.E2E.P50 = v/10, v, 2*v
		s.Queue.P50, s.Queue.P99, s.PrefillSpread.MaxOverMean = queue[i], 10*queue[i], queue[i]
		s.TTFTs = []float64{v / 10, v}
		sums = append(sums, s)
	}
	m := medianOfRuns(sums)
	if m.TTFT.P99 != 200 || m.TTFT.P50 != 20 || m.HitRatio != 0.2 || m.OfUpperBound != 0.4 || m.WallSeconds != 2 {
		t.Fatalf("medians %+v", m)
	}
	if m.Queue.P50 != 5 || m.Queue.P99 != 50 || m.PrefillSpread.MaxOverMean != 5 || m.SessionsMoved != 20 {
		t.Fatalf("queue wait %v / %v, prefill spread %v, sessions moved %d: want the medians 5 / 50, 5, 20",
			m.Queue.P50, m.Queue.P99, m.PrefillSpread.MaxOverMean, m.SessionsMoved)
	}
	if m.Runs == nil || m.Runs.N != 3 || m.Runs.TTFTP99 != [2]float64{100, 300} || m.Runs.HitRatio != [2]float64{0.1, 0.3} ||
		m.Runs.PooledTTFT.N != 6 || m.Runs.PooledTTFT.Max != 300 {
		t.Fatalf("spread %+v", m.Runs)
	}
	if m.CachedShareLow != nil {
		t.Fatalf("cached-share low %v from runs that reported none", *m.CachedShareLow)
	}
	// the lowest estimate is the lowest of the runs that reported one, not
	// the median-p99 run's
	low := []float64{0.7, 0.4}
	sums[0].CachedShareLow, sums[1].CachedShareLow = &low[0], &low[1]
	if m := medianOfRuns(sums); m.CachedShareLow == nil || *m.CachedShareLow != 0.4 {
		t.Fatalf("cached-share low %v, want 0.4", m.CachedShareLow)
	}
}

// shareStack is a fakeStack whose routers report a cached-share estimate
// that falls with every route; it remembers the lowest value it returned.
type shareStack struct {
	*fakeStack
	mu     sync.Mutex
	lowest float64
}

func (s *shareStack) CachedShares() []float64 {
	v := 1 / (1 + float64(s.routes.Load()))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lowest = min(s.lowest, v)
	return []float64{0.9, v}
}

// A run reports the lowest estimate its routers reported, and none for a
// stack without them.
func TestRunReportsLowestCachedShare(t *testing.T) {
	var stacks []*fakeStack
	var shares []*shareStack
	fake := newFakeFactory(&stacks, 0)
	factory := func(ctx context.Context, cfg StackConfig) (Stack, error) {
		st, err := fake(ctx, cfg)
		if err != nil || cfg.Policy.Name == "round-robin" {
			return st, err
		}
		s := &shareStack{fakeStack: st.(*fakeStack), lowest: 1}
		shares = append(shares, s)
		return s, nil
	}
	pols, _ := LookupPolicies([]string{"kvrouter", "round-robin"})
	rep, err := Run(context.Background(), Config{Workload: smallWorkload(), Policies: pols, NewStack: factory, Workers: 4, Speedup: 1000, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	kv, rr := rep.Policy("kvrouter"), rep.Policy("round-robin")
	if len(shares) != 1 || kv.CachedShareLow == nil || *kv.CachedShareLow != shares[0].lowest || shares[0].lowest >= 0.9 {
		t.Fatalf("kvrouter's lowest cached share %v, want the stack's lowest %v", kv.CachedShareLow, shares)
	}
	if rr.CachedShareLow != nil {
		t.Fatalf("round-robin's stack reports no estimate, got %v", *rr.CachedShareLow)
	}
}

// Issue 17's checks: kvrouter against every policy but true-cache (dynamo,
// Dynamo's weights, is a peer like the others), on its path only.
func TestPeerChecks(t *testing.T) {
	row := func(name, path string, p50, p99 float64) metrics.Summary {
		s := metrics.Summary{Policy: name, Path: path, Done: 1}
		s.TTFT.P50, s.TTFT.P99 = p50, p99
		return s
	}
	r := &report.Report{Policies: []metrics.Summary{
		row("kvrouter", "nats", 100, 1000), row("true-cache", "nats", 50, 500), row("dynamo", "nats", 130, 1500),
		row("llmd", "nats", 120, 1300), row("sglang", "nats", 110, 1100), row("kvrouter", "gateway", 10, 10),
	}}
	got := map[string]bool{}
	for _, c := range peerChecks(r, &r.Policies[0]) {
		got[c.Name] = c.Pass
	}
	want := map[string]bool{
		"kvrouter lowest TTFT p50 of the deployable policies": true,
		"kvrouter lowest TTFT p99 of the deployable policies": true,
		"kvrouter p99 TTFT lower than the best peer's":        false, // 1100 / 1000 < 1.2
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s: pass %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// The route API and every booking see max_tokens as the client sends it,
// never a request's own output length; the engine generates the output
// length, stopping at max_tokens.
func TestMaxTokensRule(t *testing.T) {
	w := workload.Chat(workload.ChatConfig{Seed: 4, Sessions: 6, Turns: 3, SystemTokens: 64, UserTokens: 16, OutputTokens: 40, SessionRate: 100})
	w.MaxTokens = 48 // outputs are 20..60: some stop at max_tokens
	var stacks []*fakeStack
	pols, _ := LookupPolicies([]string{"kvrouter,true-cache"})
	rep, err := Run(context.Background(), Config{Workload: w, Policies: pols, NewStack: newFakeFactory(&stacks, 0), Workers: 2, Speedup: 1e4})
	if err != nil {
		t.Fatal(err)
	}
	truncated := 0
	for _, s := range stacks {
		for _, r := range w.Requests {
			if got := s.expected[r.ID]; got != 48 {
				t.Fatalf("%s: %s routed with expected output %d, want max_tokens 48 (true length %d)", s.cfg.Policy.Name, r.ID, got, r.OutputLength)
			}
			if got, want := s.generated[r.ID], min(r.OutputLength, 48); got != want {
				t.Fatalf("%s: %s generated %d tokens, want %d", s.cfg.Policy.Name, r.ID, got, want)
			}
			if s == stacks[0] && r.OutputLength > 48 {
				truncated++
			}
		}
	}
	if truncated == 0 || rep.Workload.MaxTokens != 48 || rep.Workload.Truncated != truncated {
		t.Fatalf("report: max_tokens %d, %d truncated; want 48 and %d (> 0)", rep.Workload.MaxTokens, rep.Workload.Truncated, truncated)
	}
	// Config.MaxTokens overrides the workload's; the default is the
	// workload's client cap.
	stacks = nil
	if _, err := Run(context.Background(), Config{Workload: w, Policies: pols[:1], NewStack: newFakeFactory(&stacks, 0), Workers: 2, Speedup: 1e4, MaxTokens: 4096}); err != nil {
		t.Fatal(err)
	}
	if got := stacks[0].expected[w.Requests[0].ID]; got != 4096 {
		t.Fatalf("MaxTokens 4096: routed with %d", got)
	}
	if w.MaxTokens = 0; w.ClientMaxTokens() != workload.DefaultMaxTokens {
		t.Fatal("default client cap")
	}
}

// With Samples, run r replays its own workload: the stacks of the second
// run route the second sample's requests, the pooled TTFT holds both
// samples' requests, each run's hit ratio is against its own bound, and
// the note says the runs are samples. Samples that do not match the runs
// are refused.
func TestRunSamples(t *testing.T) {
	var stacks []*fakeStack
	w := smallWorkload()
	w2 := workload.SharedPrefix(workload.SharedPrefixConfig{Seed: 2, Groups: 4, PromptsPerGroup: 5, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 8, Rate: 2000})
	pols, _ := LookupPolicies([]string{"kvrouter,round-robin"})
	cfg := Config{Workload: w, Samples: []*workload.Workload{w, w2}, Runs: 2, Policies: pols, NewStack: newFakeFactory(&stacks, 0), Workers: 4, Speedup: 1000}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(stacks) != 2*len(pols) {
		t.Fatalf("%d stacks", len(stacks))
	}
	for i, s := range stacks {
		want := len(w.Requests)
		if i >= len(pols) {
			want = len(w2.Requests)
		}
		if s.routes.Load() != int64(want) {
			t.Fatalf("stack %d (%s): %d routes, want %d", i, s.cfg.Policy.Name, s.routes.Load(), want)
		}
	}
	for _, p := range rep.Policies {
		if p.Runs == nil || p.Runs.PooledTTFT.N != len(w.Requests)+len(w2.Requests) {
			t.Fatalf("%s: runs %+v, want %d requests pooled", p.Policy, p.Runs, len(w.Requests)+len(w2.Requests))
		}
	}
	if !strings.Contains(strings.Join(rep.Notes, " "), "each on its own workload sample") {
		t.Fatalf("notes %q", rep.Notes)
	}
	for _, bad := range [][]*workload.Workload{{w}, {w2, w}, {w, {}}} {
		c := cfg
		c.Samples = bad
		if _, err := Run(context.Background(), c); !errors.Is(err, ErrConfig) {
			t.Errorf("%d samples: %v", len(bad), err)
		}
	}
}
