package scheduler

import (
	"errors"
	"fmt"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/kvevents"
)

// peerReq is a request of blocks full blocks of 16 tokens (hashes 1..n, or
// from base on) and tokens prompt tokens.
func peerReq(id string, base, blocks int) *Request {
	r := &Request{ID: id, Tokens: blocks * 16}
	for i := range blocks {
		r.SeqHashes = append(r.SeqHashes, kvevents.SeqHash(base+i+1))
	}
	return r
}

func pick(t *testing.T, p Policy, r *Request, rows []CandidateRow) string {
	t.Helper()
	x, c := NewCandidates(r, 16, len(r.SeqHashes), 1, nil, rows)
	i, err := p.Select(x, c)
	if err != nil {
		t.Fatalf("%s: %v", p.Name(), err)
	}
	return c.Key(i).Worker
}

// llm-d's default profile: 3·prefix + 2·queue + 2·kv, each normalised as
// llm-d's scorers do, the queue being the engines' reported waiting count.
// Hand-computed scores are in each case's comment.
func TestLLMDDecisions(t *testing.T) {
	cases := []struct {
		name string
		rows []CandidateRow
		want string
	}{
		{
			// a: 3·1 + 2·1 + 2·1 = 7; b: 0 + 2 + 2 = 4.
			name: "equal load: the prefix holder",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 10, WaitingRequests: 3, KVBlocks: 1000},
				{Key: wk("b", 0), WaitingRequests: 3, KVBlocks: 1000},
			},
			want: "a",
		},
		{
			// a: 3·0.5 + 2·0 + 2·1 = 3.5; b: 0 + 2·1 + 2·1 = 4: a half
			// match does not outweigh the longest queue.
			name: "half match on the longest queue loses",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 5, WaitingRequests: 9, KVBlocks: 1000},
				{Key: wk("b", 0), WaitingRequests: 1, KVBlocks: 1000},
			},
			want: "b",
		},
		{
			// a: 3·1 + 2·0 + 2·(1−0.4) = 4.2; b: 0 + 2·1 + 2·1 = 4;
			// c: 3·0.8 + 2·(9−5)/8 + 2·(1−0.9) = 3.6.
			name: "full match beats an empty worker when its KV is not full",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 10, WaitingRequests: 9, ActiveDecodeBlocks: 400, KVBlocks: 1000},
				{Key: wk("b", 0), WaitingRequests: 1, KVBlocks: 1000},
				{Key: wk("c", 0), OverlapBlocks: 8, WaitingRequests: 5, ActiveDecodeBlocks: 900, KVBlocks: 1000},
			},
			want: "a",
		},
		{
			// KV usage alone: queues equal (1), no match; b is emptier.
			name: "kv utilisation breaks an equal queue",
			rows: []CandidateRow{
				{Key: wk("a", 0), WaitingRequests: 2, ActiveDecodeBlocks: 800, KVBlocks: 1000},
				{Key: wk("b", 0), WaitingRequests: 2, ActiveDecodeBlocks: 100, KVBlocks: 1000},
			},
			want: "b",
		},
		{
			// Usage clamps at 1 (over-booked) and is 0 when the capacity is
			// unknown: b (unknown) scores 2·1, a scores 0.
			name: "unknown capacity counts as empty",
			rows: []CandidateRow{
				{Key: wk("a", 0), WaitingRequests: 2, ActiveDecodeBlocks: 5000, KVBlocks: 1000},
				{Key: wk("b", 0), WaitingRequests: 2, ActiveDecodeBlocks: 5000},
			},
			want: "b",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := pick(t, NewLLMD(), peerReq("r", 0, 10), tc.rows); got != tc.want {
				t.Fatalf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

// llm-d's max-score picker breaks ties at random, and so does Dynamo's
// picker (reservoir sampling in lib/router-plugins default/picker.rs, not
// tree size nor order): identical workers are both picked over many seeds.
func TestPeerTiesAreRandom(t *testing.T) {
	rows := []CandidateRow{{Key: wk("a", 0), KVBlocks: 10}, {Key: wk("b", 0), KVBlocks: 10}}
	for _, p := range []Policy{NewLLMD(), NewDynamoPolicy(0)} {
		seen := map[string]bool{}
		for seed := range uint64(64) {
			x, c := NewCandidates(peerReq("r", 0, 4), 16, 4, seed, nil, rows)
			i, err := p.Select(x, c)
			if err != nil {
				t.Fatal(err)
			}
			seen[c.Key(i).Worker] = true
		}
		if len(seen) != 2 {
			t.Fatalf("%T: 64 seeds picked only %v", p, seen)
		}
	}
}

// The scorers' normalisations, row by row.
func TestLLMDScorers(t *testing.T) {
	rows := []CandidateRow{
		{Key: wk("a", 0), OverlapBlocks: 4, WaitingRequests: 2, ActiveDecodeBlocks: 250, KVBlocks: 1000},
		{Key: wk("b", 0), OverlapBlocks: 0, WaitingRequests: 6, ActiveDecodeBlocks: 0, KVBlocks: 1000},
		{Key: wk("c", 0), OverlapBlocks: 8, WaitingRequests: 4, ActiveDecodeBlocks: 1000, KVBlocks: 1000},
	}
	x, c := NewCandidates(peerReq("r", 0, 8), 16, 8, 1, nil, rows)
	for _, tc := range []struct {
		s    Scorer
		want []float64 // scores (the scorer writes their negation)
	}{
		{LLMDPrefixScorer{}, []float64{0.5, 0, 1}},
		{LLMDQueueScorer{}, []float64{1, 0, 0.5}},
		{LLMDKVUtilizationScorer{}, []float64{0.75, 1, 0}},
	} {
		cost := make([]float64, 3)
		tc.s.Score(x, c, cost)
		for i := range cost {
			if -cost[i] != tc.want[i] {
				t.Errorf("%T row %d: score %v, want %v", tc.s, i, -cost[i], tc.want[i])
			}
		}
	}
	equal := []CandidateRow{{Key: wk("a", 0), WaitingRequests: 3}, {Key: wk("b", 0), WaitingRequests: 3}}
	x, c = NewCandidates(peerReq("r", 0, 8), 16, 8, 1, nil, equal)
	cost := make([]float64, 2)
	LLMDQueueScorer{}.Score(x, c, cost)
	if cost[0] != -1 || cost[1] != -1 {
		t.Fatalf("equal queues score %v, want 1 each", cost)
	}
}

// SGLang's cache-aware decision with the router's defaults 0.3, 64, 1.5.
func TestSGLangDecisions(t *testing.T) {
	cases := []struct {
		name string
		rows []CandidateRow
		want string
	}{
		{
			// 70 − 5 > 64 and 70 > 7.5: shortest queue, despite a's cache.
			name: "imbalanced: shortest queue",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 10, ActiveRequests: 70, KVBlocks: 100},
				{Key: wk("b", 0), ActiveRequests: 5, KVBlocks: 100},
				{Key: wk("c", 0), ActiveRequests: 6, KVBlocks: 100},
			},
			want: "b",
		},
		{
			// 270 − 200 = 70 > 64 but 270 < 1.5 × 200: balanced, so cache.
			name: "absolute gap without relative gap stays on cache",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 10, ActiveRequests: 270, KVBlocks: 100},
				{Key: wk("b", 0), ActiveRequests: 200, KVBlocks: 100},
			},
			want: "a",
		},
		{
			// 64 − 0 = 64 is not > 64: balanced.
			name: "gap of exactly 64 is balanced",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 4, ActiveRequests: 64, KVBlocks: 100},
				{Key: wk("b", 0), ActiveRequests: 0, KVBlocks: 100},
			},
			want: "a",
		},
		{
			// match 4/10 = 0.4 > 0.3: the holder of the best prefix.
			name: "match rate above the threshold: best match",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 2, ActiveRequests: 1, KVBlocks: 100},
				{Key: wk("b", 0), OverlapBlocks: 4, ActiveRequests: 9, KVBlocks: 100},
				{Key: wk("c", 0), ActiveRequests: 0, KVBlocks: 100},
			},
			want: "b",
		},
		{
			// 3/10 = 0.3 is not > 0.3: the smallest tree (c holds 10
			// blocks), not the most free KV (b) nor the shortest queue (b).
			name: "match rate at the threshold: smallest tree",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 3, ActiveRequests: 1, ActiveDecodeBlocks: 50, KVBlocks: 100, RoutedBlocks: 60},
				{Key: wk("b", 0), ActiveRequests: 0, ActiveDecodeBlocks: 5, KVBlocks: 100, RoutedBlocks: 30},
				{Key: wk("c", 0), ActiveRequests: 4, ActiveDecodeBlocks: 50, KVBlocks: 100, RoutedBlocks: 10},
			},
			want: "c",
		},
		{
			// Two holders of the best prefix: the one the tree names (the
			// first), whatever its load.
			name: "best-match tie: first holder, not the lower load",
			rows: []CandidateRow{
				{Key: wk("a", 0), OverlapBlocks: 6, ActiveRequests: 5, KVBlocks: 100},
				{Key: wk("b", 0), OverlapBlocks: 6, ActiveRequests: 2, KVBlocks: 100},
			},
			want: "a",
		},
		{
			// Trees of equal size: the first worker, not the lower load.
			name: "smallest-tree tie: first worker",
			rows: []CandidateRow{
				{Key: wk("a", 0), ActiveRequests: 9, RoutedBlocks: 7},
				{Key: wk("b", 0), ActiveRequests: 1, RoutedBlocks: 7},
			},
			want: "a",
		},
		{
			// Everything equal: the first worker, as min_by_key.
			name: "full tie: first worker",
			rows: []CandidateRow{
				{Key: wk("a", 0), KVBlocks: 100},
				{Key: wk("b", 0), KVBlocks: 100},
			},
			want: "a",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := pick(t, NewSGLang(), peerReq("r", 0, 10), tc.rows); got != tc.want {
				t.Fatalf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

// dynamo is the default policy with Dynamo's weights: the registry builds a
// DefaultPolicy with DynamoCostParams, and it picks the documented example
// of Dynamo's cost (docs/router/kv_cache_routing.md, weight 1): worker 1
// costs 8 + 10 = 18, worker 2 5 + 5 = 10, worker 3 2 + 9 = 11, so worker 2.
func TestDynamoIsDynamosCost(t *testing.T) {
	reg := NewRegistry()
	p, err := reg.Build(PolicyConfig{Name: "dynamo"})
	if err != nil {
		t.Fatal(err)
	}
	d, ok := p.(*DefaultPolicy)
	if !ok || d.Cost != DynamoCostParams() || d.Temperature != 0 || d.HasSeed {
		t.Fatalf("dynamo built %T %+v, want the default policy with Dynamo's parameters", p, p)
	}
	for _, tc := range []struct {
		doc   string
		errIs error
	}{
		{"{temperature: 0.5, seed: 3}", nil},
		{"{overlap_credit: 2}", ErrInvalidConfig}, // not Dynamo's cost: that is `default`
		{"{temperature: -1}", ErrInvalidConfig},
	} {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(tc.doc), &n); err != nil {
			t.Fatal(err)
		}
		q, err := reg.Build(PolicyConfig{Name: "dynamo", Params: *n.Content[0]})
		if !errors.Is(err, tc.errIs) {
			t.Fatalf("%s: err %v, want %v", tc.doc, err, tc.errIs)
		}
		if err == nil {
			if d := q.(*DefaultPolicy); d.Temperature != 0.5 || !d.HasSeed || d.SeedValue != 3 || d.Cost != DynamoCostParams() {
				t.Fatalf("%s: built %+v", tc.doc, d)
			}
		}
	}
	r := peerReq("r", 0, 10) // ISL 160 tokens = 10 blocks
	rows := []CandidateRow{
		{Key: wk("w1", 0), OverlapBlocks: 2, ActiveDecodeBlocks: 10},
		{Key: wk("w2", 0), OverlapBlocks: 5, ActiveDecodeBlocks: 5},
		{Key: wk("w3", 0), OverlapBlocks: 8, ActiveDecodeBlocks: 9},
	}
	x, c := NewCandidates(r, 16, 0, 1, nil, rows)
	i, err := p.Select(x, c)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Key(i).Worker; got != "w2" {
		t.Fatalf("picked %s, want w2", got)
	}
}

// CHWBL: a prefix has an owner on the ring; the bound load + 1 <=
// 1.25 × (total + 1)/n moves it to the next worker on the ring and back.
func TestCHWBLDecisions(t *testing.T) {
	p := NewCHWBL()
	names := []string{"a", "b", "c", "d"}
	rows := func(load map[string]int) []CandidateRow {
		var out []CandidateRow
		for _, n := range names {
			out = append(out, CandidateRow{Key: wk(n, 0), ActiveRequests: load[n]})
		}
		return out
	}
	r := peerReq("r1", 100, 6)
	owner := pick(t, p, r, rows(nil))
	// The key is the prefix (the second 16-token block for 100 characters):
	// a prompt that shares two blocks and differs after goes to the same
	// worker, at any length.
	other := peerReq("r2", 100, 2)
	other.SeqHashes = append(other.SeqHashes, 999, 998, 997)
	if got := pick(t, p, other, rows(nil)); got != owner {
		t.Fatalf("same prefix went to %s, owner %s", got, owner)
	}
	// Stable for a fixed load, whatever the request id.
	if got := pick(t, p, peerReq("r3", 100, 6), rows(nil)); got != owner {
		t.Fatalf("repeat went to %s, owner %s", got, owner)
	}
	// total 11, n 4: bound 1.25 × 12/4 = 3.75. The owner at 2 passes
	// (3 <= 3.75), at 3 it does not (4 > 3.75) and the next on the ring
	// takes it.
	spread := func(ownerLoad int) map[string]int {
		l := map[string]int{owner: ownerLoad}
		left := 11 - ownerLoad
		for _, n := range names {
			if n != owner && left > 0 {
				take := min(left, 3)
				l[n] = take
				left -= take
			}
		}
		return l
	}
	if got := pick(t, p, r, rows(spread(2))); got != owner {
		t.Fatalf("owner at load 2 of 11 lost the request to %s", got)
	}
	second := pick(t, p, r, rows(map[string]int{owner: 10}))
	if second == owner {
		t.Fatalf("owner at load 10 of 10 kept the request")
	}
	if got := pick(t, p, r, rows(map[string]int{owner: 10})); got != second {
		t.Fatalf("the walk is not stable: %s then %s", second, got)
	}
	// The owner and the second over the bound: a third worker.
	third := pick(t, p, r, rows(map[string]int{owner: 5, second: 5}))
	if third == owner || third == second {
		t.Fatalf("third pick %s is the owner or the second (%s, %s)", third, owner, second)
	}
	// Every worker over the bound cannot happen with factor >= 1, but a
	// candidate set of one always has a pick.
	if got := pick(t, p, r, []CandidateRow{{Key: wk("z", 0), ActiveRequests: 50}}); got != "z" {
		t.Fatalf("single candidate: %s", got)
	}
}

// Without a load bound (load factor huge) CHWBL is plain consistent
// hashing: over many prefixes every worker owns some, and removing a worker
// moves only the prefixes it owned.
func TestCHWBLConsistency(t *testing.T) {
	p := &CHWBL{LoadFactor: 1e9, Replication: 256, PrefixChars: 100}
	all := []CandidateRow{{Key: wk("a", 0)}, {Key: wk("b", 0)}, {Key: wk("c", 0)}, {Key: wk("d", 0)}}
	owned := map[string]int{}
	moved := 0
	for k := range 400 {
		r := peerReq(fmt.Sprint(k), k*10, 3)
		w := pick(t, p, r, all)
		owned[w]++
		if got := pick(t, p, r, all[:3]); got != w && w != "d" {
			moved++
		}
	}
	if len(owned) != 4 {
		t.Fatalf("owners %v: want all four", owned)
	}
	for w, n := range owned {
		if n < 40 {
			t.Errorf("worker %s owns %d of 400 prefixes: ring badly spread (%v)", w, n, owned)
		}
	}
	if moved != 0 {
		t.Fatalf("removing d moved %d prefixes owned by others", moved)
	}
}

func TestPeerPoliciesFromYAML(t *testing.T) {
	reg := NewRegistry()
	for _, tc := range []struct {
		doc     string
		wantErr bool
	}{
		{"name: llmd", false},
		{"name: llmd\nparams: {prefix_weight: 2, queue_weight: 1, kv_utilization_weight: 1}", false},
		{"name: llmd\nparams: {prefix_weight: -1}", true},
		{"name: sglang", false},
		{"name: sglang\nparams: {cache_threshold: 0.5, balance_abs_threshold: 32, balance_rel_threshold: 1.1}", false},
		{"name: sglang\nparams: {cache_treshold: 0.5}", true},
		{"name: dynamo\nparams: {temperature: 0.5}", false},
		{"name: chwbl", false},
		{"name: chwbl\nparams: {load_factor: 0.9}", true},
		{"name: chwbl\nparams: {replication: 0}", true},
		{"name: pipeline\nparams: {scorers: [{name: llmd-prefix, weight: 3}, {name: llmd-queue}, {name: llmd-kv-utilization}]}", false},
	} {
		_, err := reg.BuildYAML([]byte(tc.doc))
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: err %v, want error %v", tc.doc, err, tc.wantErr)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: %v does not wrap ErrInvalidConfig", tc.doc, err)
		}
	}
	p, err := reg.BuildYAML([]byte("name: chwbl\nparams: {load_factor: 2}"))
	if err != nil || p.(*CHWBL).LoadFactor != 2 || p.(*CHWBL).Replication != 256 {
		t.Fatalf("chwbl params: %v %+v", err, p)
	}
}

// Every peer policy refuses an empty candidate set instead of panicking.
func TestPeerPoliciesEmpty(t *testing.T) {
	for _, p := range []Policy{NewLLMD(), NewSGLang(), NewCHWBL()} {
		x, c := NewCandidates(peerReq("r", 0, 2), 16, 2, 1, nil, nil)
		if _, err := p.Select(x, c); !errors.Is(err, ErrNoCandidate) {
			t.Errorf("%s: %v, want ErrNoCandidate", p.Name(), err)
		}
	}
}

// BenchmarkPeerSelection is one selection by each peer policy over n
// candidates with overlaps and loads, outside a scheduler (the policy's own
// cost; the scheduler adds the same eligibility and booking for all).
func BenchmarkPeerSelection(b *testing.B) {
	for _, n := range []int{8, 1024} {
		rows := make([]CandidateRow, n)
		for i := range rows {
			rows[i] = CandidateRow{Key: wk(fmt.Sprintf("w%04d", i), 0), OverlapBlocks: i % 9, ActiveRequests: i % 13,
				ActiveDecodeBlocks: 37 * (i % 7), KVBlocks: 4096, ActivePrefillTokens: 100 * (i % 5)}
		}
		for _, p := range []Policy{NewDefaultPolicy(0), NewLLMD(), NewSGLang(), NewCHWBL()} {
			b.Run(fmt.Sprintf("%s/workers=%d", p.Name(), n), func(b *testing.B) {
				r := peerReq("r", 0, 8)
				x, c := NewCandidates(r, 16, 8, 1, nil, rows)
				b.ReportAllocs()
				for b.Loop() {
					if _, err := p.Select(x, c); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
