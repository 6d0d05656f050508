package scheduler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/workerref"
)

// Dynamo's documented example at weight 1 (DynamoCostParams): worker 1
// scores 8+10 = 18, worker 2 scores 5+5 = 10 (chosen), worker 3 scores
// 2+9 = 11.
func TestDynamoCostKnownAnswer(t *testing.T) {
	r := &Request{Tokens: 128} // 8 blocks of 16
	rows := []CandidateRow{
		{Key: wk("w1", 0), OverlapBlocks: 0, ActiveDecodeBlocks: 10},
		{Key: wk("w2", 0), OverlapBlocks: 3, ActiveDecodeBlocks: 5},
		{Key: wk("w3", 0), OverlapBlocks: 6, ActiveDecodeBlocks: 9},
	}
	x, c := NewCandidates(r, 16, 0, 1, nil, rows)
	cost := make([]float64, 3)
	DefaultCost{Params: DynamoCostParams()}.Score(x, c, cost)
	if want := []float64{18, 10, 11}; fmt.Sprint(cost) != fmt.Sprint(want) {
		t.Fatalf("costs %v, want %v", cost, want)
	}
	i, err := NewDynamoPolicy(0).Select(x, c)
	if err != nil || c.Key(i) != wk("w2", 0) {
		t.Fatalf("picked %d (%v), want w2", i, err)
	}
}

// Where the default's weights and Dynamo's part: a conversation turn of 27
// blocks (512 tokens each), 20 of them cached on a worker with 16 blocks of
// prefill queued and 20 decode blocks, against an idle worker, and with a
// copy of the prefix on a third worker with 40 blocks queued. Dynamo moves
// the session: holder 16+27−20 + 20+27 = 70, idle 27 + 27 = 54. The
// default keeps it on its cache once two workers hold the prefix: holder
// max(0, 43 − 1.25·20) + 0.25·47 = 29.75, idle 27 + 0.25·27 = 33.75. Held
// by one worker only, the base credit is SoleHolderCredit (1): holder
// 43 − 20 + 11.75 = 34.75, and the turn makes the prefix's first copy on
// the idle worker. (The step term is waived on both holders: their overlap
// is booked, not reported, so the turn would share the prefill in flight.)
func TestDefaultKeepsCacheHolder(t *testing.T) {
	const bs = 512
	holder := CandidateRow{Key: wk("holder", 0), OverlapBlocks: 20, ActivePrefillTokens: 16 * bs, ActiveDecodeBlocks: 20}
	idle := CandidateRow{Key: wk("idle", 0)}
	cp := CandidateRow{Key: wk("copy", 0), OverlapBlocks: 20, ActivePrefillTokens: 40 * bs, ActiveDecodeBlocks: 20}
	for _, tc := range []struct {
		p    *DefaultPolicy
		rows []CandidateRow
		want []float64
		pick string
	}{
		{NewDynamoPolicy(0), []CandidateRow{holder, idle}, []float64{70, 54}, "idle"},
		{NewDefaultPolicy(0), []CandidateRow{holder, idle}, []float64{34.75, 33.75}, "idle"},
		{NewDynamoPolicy(0), []CandidateRow{holder, idle, cp}, []float64{70, 54, 94}, "idle"},
		{NewDefaultPolicy(0), []CandidateRow{holder, idle, cp}, []float64{29.75, 33.75, 53.75}, "holder"},
	} {
		rows := tc.rows
		x, c := NewCandidates(&Request{Tokens: 27 * bs}, bs, 27, 1, nil, rows)
		cost := make([]float64, len(rows))
		DefaultCost{Params: tc.p.Cost}.Score(x, c, cost)
		for i := range cost {
			if math.Abs(cost[i]-tc.want[i]) > 1e-9 {
				t.Fatalf("%+v: costs %v, want %v", tc.p.Cost, cost, tc.want)
			}
		}
		i, err := tc.p.Select(x, c)
		if err != nil || c.Key(i) != wk(tc.pick, 0) {
			t.Errorf("%+v: picked %v (%v), want %s", tc.p.Cost, c.Key(i), err, tc.pick)
		}
	}
}

func TestDefaultCostTerms(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    CostParams
		row  CandidateRow
		reqB int
		want float64
	}{
		// (active 32 + ISL 64)/16 = 6 blocks − 1·2 cached = 4, + decode 3+4 new − 1 shared = 6
		{"all terms", CostParams{1, 1, 0, 1, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{ActivePrefillTokens: 32, OverlapBlocks: 2, ActiveDecodeBlocks: 3, SharedBlocks: 1}, 4, 10},
		{"prefill scale", CostParams{2, 1, 0, 1, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{ActivePrefillTokens: 32, OverlapBlocks: 2}, 0, 8},
		{"credit clamps at zero", CostParams{1, 10, 0, 1, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{OverlapBlocks: 4}, 0, 0},
		{"half credit", CostParams{1, 0.5, 0, 1, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{OverlapBlocks: 4}, 0, 2},
		{"request weight", CostParams{1, 1, 2.5, 1, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{ActiveRequests: 4}, 0, 4 + 10},
		// decode (3 + 4 new − 1 shared) · 0.5 = 3, + prefill 4
		{"decode-block weight", CostParams{1, 1, 0, 0.5, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{ActivePrefillTokens: 32, OverlapBlocks: 2, ActiveDecodeBlocks: 3, SharedBlocks: 1}, 4, 4 + 3},
		{"decode-block weight plain", CostParams{1, 1, 0, 0.25, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{ActiveDecodeBlocks: 8}, 4, 4 + 3},
		{"no decode term", CostParams{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{ActiveDecodeBlocks: 100}, 4, 4},
		// 4 − (1·1 predicted + 0.5·3 reported) = 1.5
		{"reported credit", CostParams{1, 1, 0, 0, 0, 0, 0, 0.5, 0, 0, false, 0, 0, 0}, CandidateRow{OverlapBlocks: 4, ReportedBlocks: 3}, 0, 1.5},
		{"reported, one credit", CostParams{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, false, 0, 0, 0}, CandidateRow{OverlapBlocks: 4, ReportedBlocks: 3}, 0, 0},
		// a prefill booked: + 160/16 = 10 blocks for the step, after the clamp
		{"prefill step", CostParams{1, 1, 0, 0, 0, 0, 0, 0, 160, 0, false, 0, 0, 0}, CandidateRow{ActivePrefillTokens: 32}, 0, 6 + 10},
		{"prefill step, prefix in flight", CostParams{1, 1, 0, 0, 0, 0, 0, 0, 160, 0, false, 0, 0, 0}, CandidateRow{ActivePrefillTokens: 32, OverlapBlocks: 1}, 0, 5},
		{"prefill step, none booked", CostParams{1, 1, 0, 0, 0, 0, 0, 0, 160, 0, false, 0, 0, 0}, CandidateRow{ActiveDecodeBlocks: 8}, 0, 4},
		{"prefill step after the clamp", CostParams{1, 10, 0, 0, 0, 0, 0, 0, 160, 0, false, 0, 0, 0}, CandidateRow{ActivePrefillTokens: 32, OverlapBlocks: 4, ReportedBlocks: 4}, 0, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row := tc.row
			row.Key = wk("w", 0)
			x, c := NewCandidates(&Request{Tokens: 64}, 16, tc.reqB, 1, nil, []CandidateRow{row})
			cost := []float64{0}
			DefaultCost{Params: tc.p}.Score(x, c, cost)
			if cost[0] != tc.want {
				t.Fatalf("cost %v, want %v", cost[0], tc.want)
			}
		})
	}
}

func fixtureRows(n int) []CandidateRow {
	rows := make([]CandidateRow, n)
	for i := range rows {
		rows[i] = CandidateRow{Key: wk(fmt.Sprintf("w%05d", i), 0), OverlapBlocks: (i % 32) * 4, ReportedBlocks: (i % 32) * 4 * (i % 3) / 2,
			ActivePrefillTokens: i * 16, ActiveDecodeBlocks: i % 127, ActiveRequests: i % 17}
	}
	return rows
}

// The fused default policy picks exactly what the equivalent pipeline picks,
// draw for draw, at temperature 0 and above.
func TestDefaultPolicyMatchesPipeline(t *testing.T) {
	for _, temp := range []float64{0, 0.7, 3} {
		for _, aff := range []*workerref.Target{nil, {Worker: "w00007", AnyRank: true}} {
			t.Run(fmt.Sprint(temp, aff != nil), func(t *testing.T) {
				rows := fixtureRows(64)
				rows[3].ActivePrefillTokens = rows[5].ActivePrefillTokens // make ties likely at T0
				for i := range rows {
					rows[i].OverlapBlocks = 0
					rows[i].ActivePrefillTokens = 16 * (i % 3)
					rows[i].ActiveDecodeBlocks = 0
				}
				fused := NewDefaultPolicy(temp)
				pipe := &Pipeline{Scorers: []WeightedScorer{{Scorer: DefaultCost{Params: DefaultCostParams()}, Weight: 1}},
					Picker: SoftmaxPicker{Temperature: temp, RespectSoftAffinity: true}}
				x1, c1 := NewCandidates(&Request{Tokens: 64}, 16, 4, 99, aff, rows)
				x2, c2 := NewCandidates(&Request{Tokens: 64}, 16, 4, 99, aff, rows)
				seen := map[int]bool{}
				for range 200 {
					i1, err1 := fused.Select(x1, c1)
					i2, err2 := pipe.Select(x2, c2)
					if err1 != nil || err2 != nil || i1 != i2 {
						t.Fatalf("fused %d (%v) vs pipeline %d (%v)", i1, err1, i2, err2)
					}
					seen[i1] = true
				}
				if aff != nil && (len(seen) != 1 || !seen[7]) {
					t.Fatalf("soft target w00007 not kept: %v", seen)
				}
				if aff == nil && len(seen) < 2 {
					t.Fatalf("no tie-breaking or sampling happened: %v", seen)
				}
			})
		}
	}
}

// Temperature 0 breaks ties uniformly; an all-equal softmax is uniform; a
// seed makes the sequence reproducible.
func TestPickerDistributionAndSeed(t *testing.T) {
	rows := make([]CandidateRow, 4)
	for i := range rows {
		rows[i] = CandidateRow{Key: wk(fmt.Sprint("w", i), 0)}
	}
	for _, temp := range []float64{0, 0.7} {
		x, c := NewCandidates(&Request{Tokens: 16}, 16, 1, 5, nil, rows)
		counts := make([]int, 4)
		var seq []int
		for range 4000 {
			i, _ := NewDefaultPolicy(temp).Select(x, c)
			counts[i]++
			seq = append(seq, i)
		}
		for i, n := range counts {
			if n < 850 || n > 1150 {
				t.Fatalf("T=%v: row %d picked %d/4000 times: %v", temp, i, n, counts)
			}
		}
		x2, c2 := NewCandidates(&Request{Tokens: 16}, 16, 1, 5, nil, rows)
		for k, want := range seq[:100] {
			if i, _ := NewDefaultPolicy(temp).Select(x2, c2); i != want {
				t.Fatalf("T=%v: seeded pick %d differs: %d vs %d", temp, k, i, want)
			}
		}
	}
	// Softmax favours low cost but not exclusively.
	rows[0].ActiveDecodeBlocks = 0
	rows[1].ActiveDecodeBlocks = 10
	rows[2].ActiveDecodeBlocks = 10
	rows[3].ActiveDecodeBlocks = 10
	x, c := NewCandidates(&Request{Tokens: 16}, 16, 1, 5, nil, rows)
	counts := make([]int, 4)
	for range 4000 {
		i, _ := NewDefaultPolicy(0.7).Select(x, c)
		counts[i]++
	}
	// p(row 0) = 1/(1+3e^{-1/0.7}) ≈ 0.58
	if counts[0] < 2150 || counts[0] > 2500 || counts[1] == 0 {
		t.Fatalf("softmax counts %v", counts)
	}
}

func TestBuiltinPolicies(t *testing.T) {
	rows := []CandidateRow{
		{Key: wk("a", 0), ActiveRequests: 5, ActivePrefillTokens: 10},
		{Key: wk("b", 0), ActiveRequests: 2, ActivePrefillTokens: 50, OverlapBlocks: 6},
		{Key: wk("c", 0), ActiveRequests: 2, ActivePrefillTokens: 40},
		{Key: wk("d", 0), ActiveRequests: 9},
	}
	req := &Request{Tokens: 160, SeqHashes: hashes(10, 1)}
	t.Run("round-robin", func(t *testing.T) {
		x, c := NewCandidates(req, 16, 10, 1, nil, rows)
		var got []string
		for i := range 6 {
			x.Seq = uint64(i)
			j, _ := RoundRobin{}.Select(x, c)
			got = append(got, c.Key(j).Worker)
		}
		if strings.Join(got, "") != "abcdab" {
			t.Fatalf("round robin %v", got)
		}
	})
	t.Run("random", func(t *testing.T) {
		x, c := NewCandidates(req, 16, 10, 1, nil, rows)
		seen := map[int]int{}
		for range 400 {
			j, _ := Random{}.Select(x, c)
			seen[j]++
		}
		if len(seen) != 4 {
			t.Fatalf("random %v", seen)
		}
	})
	t.Run("least-loaded", func(t *testing.T) {
		x, c := NewCandidates(req, 16, 10, 1, nil, rows)
		for range 20 {
			if j, _ := (LeastLoaded{}).Select(x, c); c.Key(j).Worker != "c" { // 2 requests, fewer prefill than b
				t.Fatalf("least loaded picked %v", c.Key(j))
			}
		}
	})
	t.Run("power-of-two", func(t *testing.T) {
		x, c := NewCandidates(req, 16, 10, 1, nil, rows)
		seen := map[string]int{}
		for range 400 {
			j, _ := PowerOfTwo{}.Select(x, c)
			seen[c.Key(j).Worker]++
		}
		if seen["d"] != 0 { // the heaviest loses every pair it is in
			t.Fatalf("power of two picked the heaviest: %v", seen)
		}
		if seen["c"] <= seen["a"] {
			t.Fatalf("power of two favours the wrong worker: %v", seen)
		}
		x1, c1 := NewCandidates(req, 16, 10, 1, nil, rows[:1])
		if j, err := (PowerOfTwo{}).Select(x1, c1); j != 0 || err != nil {
			t.Fatal("single candidate")
		}
	})
	t.Run("two-tier", func(t *testing.T) {
		tt := NewTwoTier()
		// tier 2: b has 6/10 = 0.6 > 0.5 cached: the least loaded with the best overlap
		x, c := NewCandidates(req, 16, 10, 1, nil, rows)
		if j, _ := tt.Select(x, c); c.Key(j).Worker != "b" {
			t.Fatalf("cache tier picked %v", c.Key(j))
		}
		// tier 3: at 0.5 exactly (not strictly above) the least loaded wins
		r2 := slices.Clone(rows)
		r2[1].OverlapBlocks = 5
		x, c = NewCandidates(req, 16, 10, 1, nil, r2)
		if j, _ := tt.Select(x, c); c.Key(j).Worker != "c" {
			t.Fatalf("balance tier picked %v", c.Key(j))
		}
		// tier 1: spread 40 > 32 and 42 > 1.1·2: least loaded despite b's cache
		r3 := slices.Clone(rows)
		r3[3].ActiveRequests = 42
		x, c = NewCandidates(req, 16, 10, 1, nil, r3)
		if j, _ := tt.Select(x, c); c.Key(j).Worker != "c" {
			t.Fatalf("imbalance tier picked %v", c.Key(j))
		}
		// respect_soft_affinity keeps a candidate target (unless tier 1 fires)
		tt.RespectSoftAffinity = true
		x, c = NewCandidates(req, 16, 10, 1, new(workerref.Any("a")), rows)
		if j, _ := tt.Select(x, c); c.Key(j).Worker != "a" {
			t.Fatalf("soft affinity ignored: %v", c.Key(j))
		}
		x, c = NewCandidates(req, 16, 10, 1, new(workerref.Any("a")), r3)
		if j, _ := tt.Select(x, c); c.Key(j).Worker != "c" {
			t.Fatalf("imbalance should override affinity: %v", c.Key(j))
		}
	})
	t.Run("empty", func(t *testing.T) {
		x, c := NewCandidates(req, 16, 10, 1, nil, nil)
		for _, p := range []Policy{NewDefaultPolicy(0), NewDefaultPolicy(1), RoundRobin{}, Random{}, LeastLoaded{}, PowerOfTwo{}, NewTwoTier(), &Pipeline{}} {
			if _, err := p.Select(x, c); !errors.Is(err, ErrNoCandidate) {
				t.Fatalf("%s on no candidates: %v", p.Name(), err)
			}
		}
	})
}

func TestPipelineFiltersAndWeights(t *testing.T) {
	rows := []CandidateRow{
		{Key: wk("a", 0), ActiveRequests: 1, OverlapBlocks: 0},
		{Key: wk("b", 0), ActiveRequests: 3, OverlapBlocks: 4},
		{Key: wk("c", 0), ActiveRequests: 0, OverlapBlocks: 1},
	}
	req := &Request{Tokens: 64}
	p := &Pipeline{Scorers: []WeightedScorer{{ActiveRequestsScorer{}, 1}, {OverlapScorer{}, 1}}}
	x, c := NewCandidates(req, 16, 4, 1, nil, rows)
	// costs: a 1, b 3-4 = -1, c -1 → tie b/c broken at random; both must show
	seen := map[string]bool{}
	for range 100 {
		x, c = NewCandidates(req, 16, 4, uint64(len(seen))+x.Uint64(), nil, rows)
		j, err := p.Select(x, c)
		if err != nil {
			t.Fatal(err)
		}
		seen[c.Key(j).Worker] = true
	}
	if !seen["b"] || !seen["c"] || seen["a"] {
		t.Fatalf("picks %v", seen)
	}
	// A filter that drops everything is ErrNoCandidate.
	p.Filters = []Filter{dropWorker("a"), dropWorker("b"), dropWorker("c")}
	x, c = NewCandidates(req, 16, 4, 1, nil, rows)
	if _, err := p.Select(x, c); !errors.Is(err, ErrNoCandidate) {
		t.Fatalf("got %v", err)
	}
	// soft-affinity filter narrows only when the target is a candidate
	p = &Pipeline{Filters: []Filter{SoftAffinityFilter{}}, Scorers: []WeightedScorer{{ActiveRequestsScorer{}, 1}}}
	x, c = NewCandidates(req, 16, 4, 1, new(workerref.Any("b")), rows)
	if j, _ := p.Select(x, c); c.Key(j).Worker != "b" {
		t.Fatalf("soft-affinity filter: %v", c.Key(j))
	}
	x, c = NewCandidates(req, 16, 4, 1, new(workerref.Any("zz")), rows)
	if j, _ := p.Select(x, c); c.Key(j).Worker != "c" {
		t.Fatalf("soft-affinity filter with absent target: %v", c.Key(j))
	}
}

// A decode-block weight other than 1 reaches every fused path (the plain
// minimum, the plain softmax range, the two-row sampler and the general
// ones): the fused policy picks what the pipeline picks, draw for draw.
func TestDecodeBlockWeightFusedPaths(t *testing.T) {
	for _, n := range []int{2, 64} {
		for _, temp := range []float64{0, 0.7} {
			for _, cp := range []CostParams{
				{PrefillLoadScale: 1, OverlapCredit: 1, DecodeBlockWeight: 0.25},
				{PrefillLoadScale: 1, OverlapCredit: 2, DecodeBlockWeight: 0},
				{PrefillLoadScale: 1, OverlapCredit: 1, DecodeActiveRequestWeight: 1, DecodeBlockWeight: 0.5},
				{PrefillLoadScale: 1, OverlapCredit: 1.25, ReportedCredit: 1, DecodeBlockWeight: 0.25, SaturatedCredit: 3, SaturationTokens: 512},
				{PrefillLoadScale: 1, OverlapCredit: 2, ReportedCredit: 0.5, DecodeActiveRequestWeight: 1},
				{PrefillLoadScale: 1, OverlapCredit: 1.25, DecodeBlockWeight: 0.25, SaturatedCredit: 3, SaturationTokens: 512, PrefillStepTokens: 1024},
				{PrefillLoadScale: 1, OverlapCredit: 1, ReportedCredit: 1.5, PrefillStepTokens: 160},
				{PrefillLoadScale: 1, OverlapCredit: 1.25, SoleHolderCredit: 1, DecodeBlockWeight: 0.25, SaturatedCredit: 3, SaturationTokens: 512},
				{PrefillLoadScale: 1, OverlapCredit: 1.25, SoleHolderCredit: 0.5, ReportedCredit: 1, PrefillStepTokens: 160},
				{PrefillLoadScale: 1, OverlapCredit: 1.25, SoleHolderCredit: 1, SoleHolderReportedOnly: true, DecodeBlockWeight: 0.25, PrefillStepTokens: 1024},
			} {
				t.Run(fmt.Sprint(n, temp, cp), func(t *testing.T) {
					rows := fixtureRows(n)
					fused := &DefaultPolicy{Cost: cp, Temperature: temp}
					pipe := &Pipeline{Scorers: []WeightedScorer{{Scorer: DefaultCost{Params: cp}, Weight: 1}},
						Picker: SoftmaxPicker{Temperature: temp}}
					x1, c1 := NewCandidates(&Request{Tokens: 64}, 16, 4, 99, nil, rows)
					x2, c2 := NewCandidates(&Request{Tokens: 64}, 16, 4, 99, nil, rows)
					for range 200 {
						i1, err1 := fused.Select(x1, c1)
						i2, err2 := pipe.Select(x2, c2)
						if err1 != nil || err2 != nil || i1 != i2 {
							t.Fatalf("fused %d (%v) vs pipeline %d (%v)", i1, err1, i2, err2)
						}
					}
				})
			}
		}
	}
}

// The weight decides between the cache holder with a large decode load and
// an idle worker: 20 of 27 blocks cached on a worker with 300 active decode
// blocks. Holder 7 + w·327, idle 27 + w·27: the idle worker wins at Dynamo's
// weight 1 (334 vs 54) and at 0.1 (39.7 vs 29.7), the holder below
// 20/300 ≈ 0.067 (0.05: 23.35 vs 28.35).
func TestDecodeBlockWeightDecides(t *testing.T) {
	const bs = 512
	r := &Request{Tokens: 27 * bs}
	rows := []CandidateRow{
		{Key: wk("holder", 0), OverlapBlocks: 20, ActiveDecodeBlocks: 300},
		{Key: wk("idle", 0)},
	}
	for _, tc := range []struct {
		weight float64
		want   string
	}{{1, "idle"}, {0.1, "idle"}, {0.05, "holder"}, {0, "holder"}} {
		x, c := NewCandidates(r, bs, 27, 1, nil, rows)
		p := &DefaultPolicy{Cost: CostParams{PrefillLoadScale: 1, OverlapCredit: 1, DecodeBlockWeight: tc.weight}}
		i, err := p.Select(x, c)
		if err != nil || c.Key(i) != wk(tc.want, 0) {
			t.Errorf("weight %v: picked %v (%v), want %s", tc.weight, c.Key(i), err, tc.want)
		}
	}
}

// defaultCostWith checks that a policy is the default with DefaultCostParams
// edited by edit.
func defaultCostWith(edit func(*CostParams)) func(*testing.T, Policy) {
	return func(t *testing.T, p Policy) {
		t.Helper()
		want := DefaultCostParams()
		edit(&want)
		if d := p.(*DefaultPolicy); d.Cost != want {
			t.Fatalf("cost %+v, want %+v", d.Cost, want)
		}
	}
}

func TestRegistryYAML(t *testing.T) {
	reg := NewRegistry()
	for _, tc := range []struct {
		doc      string
		name     string
		check    func(t *testing.T, p Policy)
		errIs    error
		errMatch string
	}{
		{doc: `name: default`, name: "default", check: func(t *testing.T, p Policy) {
			d := p.(*DefaultPolicy)
			if d.Temperature != 0 || d.Cost != DefaultCostParams() || d.HasSeed {
				t.Fatalf("%+v", d)
			}
		}},
		{doc: "name: default\nparams: {temperature: 0.7, seed: 42, overlap_credit: 0.5, prefill_load_scale: 2, decode_active_request_weight: 1}",
			name: "default", check: func(t *testing.T, p Policy) {
				d := p.(*DefaultPolicy)
				want := DefaultCostParams()
				want.PrefillLoadScale, want.OverlapCredit, want.DecodeActiveRequestWeight = 2, 0.5, 1
				if d.Temperature != 0.7 || d.SeedValue != 42 || !d.HasSeed || d.Cost != want {
					t.Fatalf("%+v", d)
				}
			}},
		{doc: "name: default\nparams: {decode_leg: {transfer_block_weight: 0.5, full_penalty: 1000}}",
			name: "default", check: func(t *testing.T, p Policy) {
				want := DefaultDecodeCostParams()
				want.TransferBlockWeight, want.FullPenalty = 0.5, 1000
				if d := p.(*DefaultPolicy); d.Decode != want || d.Cost != DefaultCostParams() {
					t.Fatalf("decode leg %+v, want %+v", d.Decode, want)
				}
			}},
		{doc: "name: default\nparams: {saturated_credit: 3, saturation_tokens: 8192}", name: "default", check: func(t *testing.T, p Policy) {
			want := DefaultCostParams()
			want.SaturatedCredit, want.SaturationTokens = 3, 8192
			if d := p.(*DefaultPolicy); d.Cost != want {
				t.Fatalf("cost %+v, want %+v", d.Cost, want)
			}
		}},
		{doc: "name: default\nparams: {saturated_credit: 3, saturation_tokens: 0}", errIs: ErrInvalidConfig, errMatch: "set together"},
		{doc: "name: default\nparams: {saturated_credit: 0, saturation_tokens: 8192}", errIs: ErrInvalidConfig, errMatch: "set together"},
		{doc: "name: default\nparams: {saturated_credit: -1, saturation_tokens: 8192}", errIs: ErrInvalidConfig, errMatch: ">= 0"},
		{doc: "name: default\nparams: {reported_overlap_credit: 1}", name: "default", check: defaultCostWith(func(c *CostParams) { c.ReportedCredit = 1 })},
		{doc: "name: default\nparams: {reported_overlap_credit: -1}", errIs: ErrInvalidConfig, errMatch: ">= 0"},
		{doc: "name: default\nparams: {prefill_step_tokens: 512}", name: "default", check: defaultCostWith(func(c *CostParams) { c.PrefillStepTokens = 512 })},
		{doc: "name: default\nparams: {prefill_step_tokens: 0}", name: "default", check: defaultCostWith(func(c *CostParams) { c.PrefillStepTokens = 0 })},
		{doc: "name: default\nparams: {sole_holder_credit: 0}", name: "default", check: defaultCostWith(func(c *CostParams) { c.SoleHolderCredit = 0 })},
		{doc: "name: default", name: "default", check: func(t *testing.T, p Policy) {
			if c := p.(*DefaultPolicy).Cost; c.PrefillStepTokens != 1024 || c.SoleHolderCredit != 1 {
				t.Fatalf("the default's step %v and sole-holder credit %v, want 1024 and 1", c.PrefillStepTokens, c.SoleHolderCredit)
			}
		}},
		{doc: "name: default\nparams: {prefill_step_tokens: -1}", errIs: ErrInvalidConfig, errMatch: ">= 0"},
		{doc: "name: default\nparams: {sole_holder_credit: 1.1}", name: "default", check: defaultCostWith(func(c *CostParams) { c.SoleHolderCredit = 1.1 })},
		{doc: "name: default\nparams: {sole_holder_credit: -1}", errIs: ErrInvalidConfig, errMatch: ">= 0"},
		{doc: "name: default", name: "default", check: func(t *testing.T, p Policy) {
			if c := p.(*DefaultPolicy).Cost; c.DecodeFullShare != 0.5 || c.DecodeShareUntilHeld != 0.004 || c.DecodeShareUntilTokens != 0 {
				t.Fatalf("the default's cached-share weight %v until held %v until tokens %v, want 0.5, 0.004, 0",
					c.DecodeFullShare, c.DecodeShareUntilHeld, c.DecodeShareUntilTokens)
			}
		}},
		{doc: "name: default\nparams: {decode_weight_full_share: 1}", name: "default", check: defaultCostWith(func(c *CostParams) { c.DecodeFullShare = 1 })},
		// 0 turns the cached-share weight off, and with it the admission
		// queue's end of it, unless that is given too (and then refused).
		{doc: "name: default\nparams: {decode_weight_full_share: 0}", name: "default",
			check: defaultCostWith(func(c *CostParams) { c.DecodeFullShare, c.DecodeShareUntilHeld = 0, 0 })},
		{doc: "name: default\nparams: {decode_weight_full_share: 0, decode_weight_share_until_held: 0}", name: "default",
			check: defaultCostWith(func(c *CostParams) { c.DecodeFullShare, c.DecodeShareUntilHeld = 0, 0 })},
		{doc: "name: default\nparams: {decode_weight_full_share: 1.5}", errIs: ErrInvalidConfig, errMatch: "DecodeFullShare:1.5"},
		{doc: "name: default\nparams: {decode_weight_full_share: .nan}", errIs: ErrInvalidConfig, errMatch: "DecodeFullShare:NaN"},
		{doc: "name: default\nparams: {decode_weight_full_share: 0.5, decode_weight_share_until_tokens: 16384}", name: "default",
			check: defaultCostWith(func(c *CostParams) { c.DecodeShareUntilTokens = 16384 })},
		{doc: "name: default\nparams: {decode_weight_share_until_tokens: 16384}", name: "default",
			check: defaultCostWith(func(c *CostParams) { c.DecodeShareUntilTokens = 16384 })},
		{doc: "name: default\nparams: {decode_weight_full_share: 0, decode_weight_share_until_tokens: 16384}", errIs: ErrInvalidConfig, errMatch: "only with decode_weight_full_share"},
		{doc: "name: default\nparams: {decode_weight_full_share: 0.5, decode_weight_share_until_tokens: -1}", errIs: ErrInvalidConfig, errMatch: "DecodeShareUntilTokens:-1"},
		{doc: "name: default\nparams: {decode_weight_share_until_held: 0.02}", name: "default",
			check: defaultCostWith(func(c *CostParams) { c.DecodeShareUntilHeld = 0.02 })},
		{doc: "name: default\nparams: {decode_weight_share_until_held: 0}", name: "default",
			check: defaultCostWith(func(c *CostParams) { c.DecodeShareUntilHeld = 0 })},
		{doc: "name: default\nparams: {decode_weight_full_share: 0, decode_weight_share_until_held: 0.02}", errIs: ErrInvalidConfig, errMatch: "only with decode_weight_full_share"},
		{doc: "name: default\nparams: {decode_weight_full_share: 0.5, decode_weight_share_until_held: 1.5}", errIs: ErrInvalidConfig, errMatch: "DecodeShareUntilHeld:1.5"},
		{doc: "name: default\nparams: {decode_weight_full_share: 0.5, decode_weight_share_until_held: .nan}", errIs: ErrInvalidConfig, errMatch: "DecodeShareUntilHeld:NaN"},
		// A pipeline's default-cost scorer takes the same weights under the
		// same rules as the default policy.
		{doc: "name: pipeline\nparams: {scorers: [{name: default-cost, params: {overlap_credit: -3}}]}", errIs: ErrInvalidConfig, errMatch: ">= 0"},
		{doc: "name: pipeline\nparams: {scorers: [{name: default-cost, params: {decode_weight_full_share: 7}}]}", errIs: ErrInvalidConfig, errMatch: "DecodeFullShare:7"},
		{doc: "name: pipeline\nparams: {scorers: [{name: default-cost, params: {saturation_tokens: 0}}]}", errIs: ErrInvalidConfig, errMatch: "set together"},
		{doc: "name: pipeline\nparams: {scorers: [{name: default-cost, params: {decode_weight_full_share: 0}}]}", name: "pipeline", check: func(t *testing.T, p Policy) {
			want := DefaultCostParams()
			want.DecodeFullShare, want.DecodeShareUntilHeld = 0, 0
			if got := p.(*Pipeline).Scorers[0].Scorer.(DefaultCost).Params; got != want {
				t.Fatalf("cost %+v, want %+v", got, want)
			}
		}},
		{doc: "name: default\nparams: {booked_prefix_only_new: true}", name: "default", check: func(t *testing.T, p Policy) {
			if d := p.(*DefaultPolicy); !d.BookedPrefixOnlyNew || d.NoBookedPrefix {
				t.Fatalf("%+v", d)
			}
		}},
		{doc: "name: default\nparams: {decode_leg: {transfer_weight: 1}}", errIs: ErrInvalidConfig, errMatch: "transfer_weight"},
		{doc: "name: default\nparams: {decode_leg: {decode_block_weight: -1}}", errIs: ErrInvalidConfig, errMatch: "decode_leg"},
		{doc: "", name: "default"},
		{doc: "name: round-robin", name: "round-robin"},
		{doc: "name: random\nparams: {respect_soft_affinity: true}", name: "random", check: func(t *testing.T, p Policy) {
			if _, ok := p.(softAffinity); !ok {
				t.Fatalf("%T", p)
			}
		}},
		{doc: "name: least-loaded", name: "least-loaded"},
		{doc: "name: power-of-two", name: "power-of-two"},
		{doc: "name: two-tier", name: "two-tier", check: func(t *testing.T, p Policy) {
			if *p.(*TwoTier) != *NewTwoTier() {
				t.Fatalf("%+v", p)
			}
		}},
		{doc: "name: two-tier\nparams: {cache_threshold: 0.3, balance_abs_threshold: 64, balance_rel_threshold: 1.5, respect_soft_affinity: true}",
			name: "two-tier", check: func(t *testing.T, p Policy) {
				if *p.(*TwoTier) != (TwoTier{0.3, 64, 1.5, true}) {
					t.Fatalf("%+v", p)
				}
			}},
		{doc: `
name: pipeline
params:
  name: mine
  filters: [{name: soft-affinity}, {name: not-busy}]
  scorers:
    - {name: default-cost, params: {overlap_credit: 0.5}}
    - {name: active-requests, weight: 2}
    - {name: kv-usage, weight: 0.5}
  picker: {name: softmax, params: {temperature: 0.3, respect_soft_affinity: true}}
`, name: "mine", check: func(t *testing.T, p Policy) {
			pp := p.(*Pipeline)
			if len(pp.Filters) != 2 || len(pp.Scorers) != 3 || pp.Scorers[1].Weight != 2 ||
				pp.Scorers[0].Scorer.(DefaultCost).Params.OverlapCredit != 0.5 ||
				pp.Picker != (SoftmaxPicker{0.3, true}) {
				t.Fatalf("%+v", pp)
			}
		}},
		{doc: "name: nope", errIs: ErrUnknownPolicy},
		{doc: "name: default\nparams: {temprature: 1}", errIs: ErrInvalidConfig, errMatch: `"temprature"`},
		{doc: "name: default\nparams: {temperature: -1}", errIs: ErrInvalidConfig},
		{doc: "name: default\nparams: [1, 2]", errIs: ErrInvalidConfig},
		{doc: "name: pipeline\nparams: {scorers: [{name: nope}]}", errIs: ErrUnknownPolicy},
		{doc: "name: pipeline\nparams: {picker: {name: softmax, params: {temperature: -2}}}", errIs: ErrInvalidConfig},
		// NaN passes a "< 0" check: each number is refused unless it is
		// in range, so .nan and .inf in a policy file get an error too.
		{doc: "name: pipeline\nparams: {picker: {name: softmax, params: {temperature: .nan}}}", errIs: ErrInvalidConfig},
		{doc: "name: pipeline\nparams: {scorers: [{name: overlap, weight: .nan}]}", errIs: ErrInvalidConfig, errMatch: "weight"},
		{doc: "name: pipeline\nparams: {scorers: [{name: overlap, weight: .inf}]}", errIs: ErrInvalidConfig, errMatch: "weight"},
		{doc: "name: llmd\nparams: {queue_weight: .nan}", errIs: ErrInvalidConfig},
		{doc: "name: llmd\nparams: {prefix_weight: .inf}", errIs: ErrInvalidConfig},
		{doc: "name: sglang\nparams: {cache_threshold: .nan}", errIs: ErrInvalidConfig},
		{doc: "name: two-tier\nparams: {balance_rel_threshold: .nan}", errIs: ErrInvalidConfig},
		{doc: "name: default\nparams: {overlap_credit: .inf}", errIs: ErrInvalidConfig},
		{doc: "name: default\nparams: {decode_block_weight: .nan}", errIs: ErrInvalidConfig},
		{doc: "name: [", errIs: ErrInvalidConfig},
	} {
		t.Run(tc.doc, func(t *testing.T) {
			p, err := reg.BuildYAML([]byte(tc.doc))
			if tc.errIs != nil {
				if !errors.Is(err, tc.errIs) || !strings.Contains(fmt.Sprint(err), tc.errMatch) {
					t.Fatalf("got %v, want %v", err, tc.errIs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != tc.name {
				t.Fatalf("name %q, want %q", p.Name(), tc.name)
			}
			if tc.check != nil {
				tc.check(t, p)
			}
		})
	}
	// Custom registrations.
	if err := reg.RegisterPolicy("default", buildDefault); err == nil {
		t.Fatal("duplicate registration accepted")
	}
	if err := reg.RegisterPolicy("mine", func(*Registry, *yaml.Node) (Policy, error) { return Random{}, nil }); err != nil {
		t.Fatal(err)
	}
	if err := reg.RegisterScorer("zero", func(*yaml.Node) (Scorer, error) { return DecodeBlocksScorer{}, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.BuildYAML([]byte("name: pipeline\nparams: {scorers: [{name: zero}]}")); err != nil {
		t.Fatal(err)
	}
	if p, err := reg.BuildYAML([]byte("name: mine")); err != nil || p.Name() != "random" {
		t.Fatal(p, err)
	}
}

func TestLoadConfigYAML(t *testing.T) {
	cfg, err := LoadConfigYAML([]byte(`
replica: r1
block_size: 32
seed: 9
thresholds: {overload_prefill_frac: 2, queue_prefill_frac: 1.5}
queue:
  order: wspt
  refresh_after: 5s
  default: {requests: 100}
  limits: {batch: {requests: 10, tokens: 5000, per_worker: true}}
booking_ttl: 2m
`))
	if err != nil {
		t.Fatal(err)
	}
	full, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if full.Replica != "r1" || full.BlockSize != 32 || !full.HasSeed || full.Seed != 9 || full.Queue.Order != WSPT ||
		full.Queue.RefreshAfter.Seconds() != 5 || full.BookingTTL.Minutes() != 2 || full.Queue.Limits["batch"].Tokens != 5000 ||
		full.Thresholds != (Thresholds{OverloadPrefillFrac: 2, QueuePrefillFrac: 1.5}) || full.RemoteTTL.Seconds() != 300 {
		t.Fatalf("%+v", full)
	}
	for _, bad := range []string{"queue: {order: lifo}", "thresholds: {queue_prefill_frac: -1}", "block_size: -4", "booking_ttl: -1s",
		"queue: {limits: {x: {requests: -1}}}"} {
		cfg, err := LoadConfigYAML([]byte(bad))
		if err == nil {
			_, err = cfg.withDefaults()
		}
		if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	if _, err := New(Config{Thresholds: Thresholds{QueueDecodeFrac: math.NaN()}}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatal(err)
	}
}

// The KV-usage and prefill scorers are finite for unknown capacity.
func TestScorersFinite(t *testing.T) {
	rows := []CandidateRow{{Key: wk("a", 0)}, {Key: wk("b", 0), KVBlocks: 100, ActiveDecodeBlocks: 50}}
	x, c := NewCandidates(&Request{Tokens: 32}, 16, 2, 1, nil, rows)
	for _, s := range []Scorer{KVUsageScorer{}, PrefillTokensScorer{}, DecodeBlocksScorer{}, OverlapScorer{}, ActiveRequestsScorer{}} {
		cost := make([]float64, 2)
		s.Score(x, c, cost)
		for _, v := range cost {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("%T: %v", s, cost)
			}
		}
	}
}

func TestExpNeg(t *testing.T) {
	for x := 0.0; x > -745; x -= 0.0137 {
		got, want := expNeg(x), math.Exp(x)
		if x < -700 {
			if got != 0 {
				t.Fatalf("expNeg(%v) = %v, want 0 below the cut", x, got)
			}
			continue
		}
		if rel := math.Abs(got-want) / want; rel > 2e-7 {
			t.Fatalf("expNeg(%v) = %v, math.Exp = %v (rel err %.2e)", x, got, want, rel)
		}
	}
	if expNeg(0) != 1 {
		t.Fatal(expNeg(0))
	}
}

// The sampler's empirical distribution matches the exact softmax, for a
// high temperature (rejection path), a tiny one (linear fallback) and with
// excluded rows (Soft target), within a chi-square bound.
func TestSoftmaxDistributionExact(t *testing.T) {
	small := []float64{3, 7, 7.5, 12, 3.2, 20, 9, 4}                      // linear pass only
	large := []float64{3, 7, 7.5, 12, 3.2, 20, 9, 4, 5, 15, 6.5, 3.1, 11} // rejection first
	pick := []bool{false, true, true, false, false, true, false, true, true, false, false, true, false}
	for _, tc := range []struct {
		costs []float64
		temp  float64
		only  []bool
	}{
		{small, 0.7, nil}, {small, 0.05, nil}, {small, 0.7, pick[:8]},
		{large, 0.7, nil}, {large, 5, nil}, {large, 0.05, nil}, {large, 0.7, pick}, {large, 0.02, pick},
	} {
		costs := tc.costs
		t.Run(fmt.Sprint(len(costs), tc.temp, tc.only != nil), func(t *testing.T) {
			lo, hi := math.Inf(1), math.Inf(-1)
			for i, v := range costs {
				if tc.only != nil && !tc.only[i] {
					continue
				}
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
			want := make([]float64, len(costs))
			sum := 0.0
			for i, v := range costs {
				if tc.only != nil && !tc.only[i] {
					continue
				}
				want[i] = math.Exp(-(v - lo) / ((hi - lo) * tc.temp))
				sum += want[i]
			}
			x := &Context{rng: newRNG(11)}
			const draws = 200000
			got := make([]float64, len(costs))
			buf := make([]float64, len(costs))
			m := 0
			for i := range costs {
				if tc.only == nil || tc.only[i] {
					m++
				}
			}
			for range draws {
				for i, v := range costs {
					buf[i] = v
					if tc.only != nil && !tc.only[i] {
						buf[i] = math.NaN()
					}
				}
				got[sampleSoftmax(x, buf, lo, hi, m, tc.temp)]++
			}
			chi2, dof := 0.0, -1
			for i := range costs {
				e := want[i] / sum * draws
				if e == 0 {
					if got[i] != 0 {
						t.Fatalf("row %d has weight 0 but was drawn %v times", i, got[i])
					}
					continue
				}
				if e < 5 {
					continue
				}
				chi2 += (got[i] - e) * (got[i] - e) / e
				dof++
			}
			// p = 0.001 critical values for up to 12 degrees of freedom are < 33
			if chi2 > 33 {
				t.Fatalf("chi2 %.1f (dof %d): got %v want %v", chi2, dof, got, want)
			}
		})
	}
}

// The two-row fast path of the default policy draws exactly what the
// general path (cost buffer, range, sampleSoftmax) draws from the same
// random stream: cheaper row first, costlier row first, and a tie.
func TestSamplePairMatchesGeneral(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b int // active prefill tokens of the two rows
		temp float64
	}{
		{"cheap_first", 0, 160, 0.7},
		{"cheap_second", 320, 16, 0.7},
		{"tie", 64, 64, 0.7},
		{"hot", 0, 16, 5},
		{"cold", 0, 16, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := []CandidateRow{
				{Key: wk("a", 0), ActivePrefillTokens: tc.a, OverlapBlocks: 2, ReportedBlocks: 1},
				{Key: wk("b", 0), ActivePrefillTokens: tc.b},
			}
			r := &Request{Tokens: 256, SeqHashes: hashes(16, 1)}
			xf, cf := NewCandidates(r, 16, 20, 5, nil, rows)
			xg, cg := NewCandidates(r, 16, 20, 5, nil, rows)
			cp := DefaultCostParams() // the step term included: row a shares its prefill in flight, row b pays it
			var got [2]int
			for i := range 20000 {
				fast := samplePairPlain(xf, cf, &cp, tc.temp)
				cost := xg.costs(2)
				lo, hi, m := scoreDefaultRange(xg, cg, &cp, cost, false)
				if slow := sampleSoftmax(xg, cost, lo, hi, m, tc.temp); fast != slow {
					t.Fatalf("draw %d: fast path chose %d, general path %d", i, fast, slow)
				}
				got[fast]++
			}
			if got[0] == 0 && tc.temp >= 0.7 || got[1] == 0 && tc.temp >= 0.7 {
				t.Fatalf("one row never drawn: %v", got)
			}
		})
	}
}

// With saturated_credit the overlap credit follows the least-loaded
// candidate's prefill queue: the holder of a prefix is worth more once no
// worker is idle, and no more while one is.
func TestSaturatedCreditFollowsTheLeastLoaded(t *testing.T) {
	const bs = 512
	holder := CandidateRow{Key: wk("holder", 0), OverlapBlocks: 20, ActivePrefillTokens: 30 * bs}
	busy := CandidateRow{Key: wk("busy", 0), ActivePrefillTokens: 4 * bs}
	idle := CandidateRow{Key: wk("idle", 0)}
	adaptive := CostParams{PrefillLoadScale: 1, OverlapCredit: 1.25, SaturatedCredit: 3, SaturationTokens: 8 * bs}
	fixed := adaptive
	fixed.SaturatedCredit, fixed.SaturationTokens = 0, 0
	for _, tc := range []struct {
		name string
		p    CostParams
		rows []CandidateRow
		want []float64 // (prefill + 27 prompt blocks) − credit · overlap
		pick string
	}{
		// least 0 tokens queued: credit 1.25, the holder's queue outweighs its 20 blocks
		{"an idle worker: the base credit", adaptive, []CandidateRow{holder, idle}, []float64{32, 27}, "idle"},
		// least 4 of 8 blocks: credit 1.25 + 0.5 · (3 − 1.25) = 2.125
		{"no idle worker: a larger credit", adaptive, []CandidateRow{holder, busy}, []float64{14.5, 31}, "holder"},
		{"no idle worker, fixed credit", fixed, []CandidateRow{holder, busy}, []float64{32, 31}, "busy"},
		// a hot holder beside an idle worker is not a saturated fleet
		{"busy and idle: the base credit", adaptive, []CandidateRow{holder, busy, idle}, []float64{32, 31, 27}, "idle"},
		// past SaturationTokens the credit stays at 3 (clamped cost 0)
		{"saturated", adaptive, []CandidateRow{holder, {Key: wk("busy", 0), ActivePrefillTokens: 16 * bs}}, []float64{0, 43}, "holder"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkCosts(t, tc.p, bs, 27, tc.rows, tc.want, tc.pick) })
	}
}

// With reported_overlap_credit the blocks the engines' events report earn
// their own credit, the blocks the replica only predicts the default's: a
// holder known from events can lose to an idle worker at credit 1 where a
// holder known only from routing keeps the request at 1.25; at saturation
// both credits are 3.
func TestReportedCreditSplitsTheOverlap(t *testing.T) {
	const bs = 512
	reported := CandidateRow{Key: wk("holder", 0), OverlapBlocks: 20, ReportedBlocks: 20, ActivePrefillTokens: 22 * bs}
	predicted := reported
	predicted.ReportedBlocks = 0
	half := reported
	half.ReportedBlocks = 10
	idle := CandidateRow{Key: wk("idle", 0)}
	split := CostParams{PrefillLoadScale: 1, OverlapCredit: 1.25, ReportedCredit: 1, SaturatedCredit: 3, SaturationTokens: 8 * bs}
	one := split
	one.ReportedCredit = 0
	for _, tc := range []struct {
		name string
		p    CostParams
		rows []CandidateRow
		want []float64 // (prefill + 27 prompt blocks) − credits · overlap
		pick string
	}{
		{"reported blocks at credit 1", split, []CandidateRow{reported, idle}, []float64{29, 27}, "idle"},
		{"predicted blocks at credit 1.25", split, []CandidateRow{predicted, idle}, []float64{24, 27}, "holder"},
		{"half and half", split, []CandidateRow{half, idle}, []float64{26.5, 27}, "holder"},
		{"one credit", one, []CandidateRow{reported, idle}, []float64{24, 27}, "holder"},
		// least 16 blocks queued, past 8: both credits 3
		{"saturated", split, []CandidateRow{reported, {Key: wk("busy", 0), ActivePrefillTokens: 16 * bs}}, []float64{0, 43}, "holder"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkCosts(t, tc.p, bs, 27, tc.rows, tc.want, tc.pick) })
	}
}

// With prefill_step_tokens a short request leaves a holder that has a
// prefill in flight for an idle worker: 4 blocks, 2 of them cached (and
// reported) on a worker with 32 tokens of prefill booked. Without the term
// the holder wins (6 − 1.25·2 = 3.5 against 4); a step worth 160 tokens
// (10 blocks) sends it to the idle worker (13.5 against 4); a long cached
// prefix still keeps it on the holder (a 64-block prompt, 60 cached:
// 66 − 75 → 0, + 10 = 10 against 64). A sibling whose prefix the holder
// has only booked (overlap deeper than reported) shares the prefill in
// flight there and pays no step (3.5 against 4).
func TestPrefillStepTokens(t *testing.T) {
	const bs = 16
	short := []CandidateRow{{Key: wk("holder", 0), OverlapBlocks: 2, ReportedBlocks: 2, ActivePrefillTokens: 32}, {Key: wk("idle", 0)}}
	long := []CandidateRow{{Key: wk("holder", 0), OverlapBlocks: 60, ReportedBlocks: 60, ActivePrefillTokens: 32}, {Key: wk("idle", 0)}}
	sibling := []CandidateRow{{Key: wk("holder", 0), OverlapBlocks: 2, ReportedBlocks: 1, ActivePrefillTokens: 32}, {Key: wk("idle", 0)}}
	off := CostParams{PrefillLoadScale: 1, OverlapCredit: 1.25}
	on := off
	on.PrefillStepTokens = 160
	t.Run("off", func(t *testing.T) { checkCosts(t, off, bs, 4, short, []float64{3.5, 4}, "holder") })
	t.Run("on", func(t *testing.T) { checkCosts(t, on, bs, 4, short, []float64{13.5, 4}, "idle") })
	t.Run("on, long prefix", func(t *testing.T) { checkCosts(t, on, bs, 64, long, []float64{10, 64}, "holder") })
	t.Run("on, prefix in flight", func(t *testing.T) { checkCosts(t, on, bs, 4, sibling, []float64{3.5, 4}, "holder") })
}

// With sole_holder_credit the credit depends on how many candidates hold
// the request's prefix: 20 blocks, 16 cached on a holder with 18 blocks of
// prefill queued, an idle worker beside it. Alone, the holder earns the
// sole-holder credit 1 and loses (38 − 16 = 22 against 20); at the base
// credit 1.25 it wins (38 − 20 = 18). A second candidate holding half the
// prefix (8 blocks) makes two holders and restores 1.25; one holding 7 does
// not. The load raises the sole-holder credit as it raises the base: the
// idle worker with 8 blocks queued of a saturation at 16 is halfway, credit
// 1 + (3 − 1)/2 = 2 (38 − 32 = 6 against 28).
func TestSoleHolderCredit(t *testing.T) {
	const bs = 16
	holder := CandidateRow{Key: wk("holder", 0), OverlapBlocks: 16, ReportedBlocks: 16, ActivePrefillTokens: 18 * bs}
	idle := CandidateRow{Key: wk("idle", 0)}
	half := CandidateRow{Key: wk("half", 0), OverlapBlocks: 8, ReportedBlocks: 8, ActivePrefillTokens: 18 * bs}
	less := CandidateRow{Key: wk("less", 0), OverlapBlocks: 7, ReportedBlocks: 7, ActivePrefillTokens: 18 * bs}
	busy := CandidateRow{Key: wk("idle", 0), ActivePrefillTokens: 8 * bs}
	off := CostParams{PrefillLoadScale: 1, OverlapCredit: 1.25}
	on := off
	on.SoleHolderCredit = 1
	loaded := on
	loaded.SaturatedCredit, loaded.SaturationTokens = 3, 16*bs
	reportedOnly := on
	reportedOnly.SoleHolderReportedOnly = true
	inFlight := holder // its prefix known only from routing: a burst's sibling
	inFlight.ReportedBlocks = 0
	mostly := holder // its engine reports half the prefix
	mostly.ReportedBlocks = 8
	for _, tc := range []struct {
		name string
		p    CostParams
		rows []CandidateRow
		want []float64
		pick string
	}{
		{"off", off, []CandidateRow{holder, idle}, []float64{18, 20}, "holder"},
		{"sole holder", on, []CandidateRow{holder, idle}, []float64{22, 20}, "idle"},
		{"two holders", on, []CandidateRow{holder, half, idle}, []float64{18, 28, 20}, "holder"},
		{"a shallower overlap is no holder", on, []CandidateRow{holder, less, idle}, []float64{22, 31, 20}, "idle"},
		{"rises with the load", loaded, []CandidateRow{holder, busy}, []float64{6, 28}, "holder"},
		{"no overlap anywhere", on, []CandidateRow{{Key: wk("holder", 0)}, busy}, []float64{20, 28}, "holder"},
		{"reported only: a reported prefix", reportedOnly, []CandidateRow{holder, idle}, []float64{22, 20}, "idle"},
		{"reported only: half reported", reportedOnly, []CandidateRow{mostly, idle}, []float64{22, 20}, "idle"},
		{"reported only: a prefix in flight", reportedOnly, []CandidateRow{inFlight, idle}, []float64{18, 20}, "holder"},
		{"a prefix in flight without the option", on, []CandidateRow{inFlight, idle}, []float64{22, 20}, "idle"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkCosts(t, tc.p, bs, 20, tc.rows, tc.want, tc.pick) })
	}
}

// checkCosts scores rows for a request of blocks prompt blocks at block size
// bs, compares the costs with want, and checks that the fused default policy
// picks pick.
func checkCosts(t *testing.T, cp CostParams, bs, blocks int, rows []CandidateRow, want []float64, pick string) {
	t.Helper()
	p := &DefaultPolicy{Cost: cp, NoOutputBlocks: true}
	x, c := NewCandidates(&Request{Tokens: blocks * bs}, bs, blocks, 1, nil, rows)
	cost := make([]float64, len(rows))
	DefaultCost{Params: cp}.Score(x, c, cost)
	for i := range cost {
		if math.Abs(cost[i]-want[i]) > 1e-9 {
			t.Fatalf("costs %v, want %v", cost, want)
		}
	}
	i, err := p.Select(x, c)
	if err != nil || c.Key(i) != wk(pick, 0) {
		t.Errorf("picked %v (%v), want %s", c.Key(i), err, pick)
	}
}

// TestDecodeWeightByCachedShare pins the experiment of stop 50: with
// DecodeFullShare the decode-block weight follows Context.CachedShare, in
// the fused passes and the pipeline scorer alike.
func TestDecodeWeightByCachedShare(t *testing.T) {
	const bs = 16
	// The holder has the prompt's 16 blocks cached and 40 decode blocks
	// booked; the idle worker has neither.
	base := CostParams{PrefillLoadScale: 1, OverlapCredit: 1, DecodeBlockWeight: 0.5}
	withFull := func(f float64) CostParams { p := base; p.DecodeFullShare = f; return p }
	scaled, knee := withFull(1), withFull(0.5) // knee: whole from half the blocks cached
	fading := knee
	fading.DecodeShareUntilTokens = 4096 // the reduction gone once both queue 4,096 tokens
	held := knee
	held.DecodeShareUntilHeld = 0.02 // the reduction gone once 2 % of the selections had waited
	for _, tc := range []struct {
		name   string
		p      CostParams
		share  float64
		held   float64   // Context.HeldShare
		queued int       // prefill tokens queued on both candidates
		want   []float64 // prefill ((queued + 320)/16 − 16 | (queued + 320)/16) + weight · decode (40 + 20 | 20)
		pick   string
	}{
		{"off: the share is ignored", base, 0.2, 0, 0, []float64{4 + 30, 20 + 10}, "idle"},
		{"on, all cached", scaled, 1, 0, 0, []float64{4 + 30, 20 + 10}, "idle"},
		{"on, a fifth cached", scaled, 0.2, 0, 0, []float64{4 + 6, 20 + 2}, "holder"},
		{"on, nothing cached", scaled, 0, 0, 0, []float64{4, 20}, "holder"},
		{"on, out of range is clamped", scaled, 7, 0, 0, []float64{4 + 30, 20 + 10}, "idle"},
		{"whole from half: a fifth cached", knee, 0.2, 0, 0, []float64{4 + 12, 20 + 4}, "holder"},
		{"whole from half: half cached", knee, 0.5, 0, 0, []float64{4 + 30, 20 + 10}, "idle"},
		{"whole from half: more", knee, 0.8, 0, 0, []float64{4 + 30, 20 + 10}, "idle"},
		{"fading: nothing cached, no load", fading, 0, 0, 0, []float64{4, 20}, "holder"},
		{"fading: half the tokens queued", fading, 0, 0, 2048, []float64{148 - 16 + 15, 148 + 5}, "holder"},
		{"fading: past the tokens, whole", fading, 0, 0, 8192, []float64{532 - 16 + 30, 532 + 10}, "idle"},
		{"held: none waited", held, 0, 0, 0, []float64{4, 20}, "holder"},
		{"held: 1 % waited, half", held, 0, 0.01, 0, []float64{4 + 15, 20 + 5}, "holder"},
		{"held: 5 % waited, whole", held, 0, 0.05, 0, []float64{4 + 30, 20 + 10}, "idle"},
		{"held: ignored without it", knee, 0, 0.5, 0, []float64{4, 20}, "holder"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder := CandidateRow{Key: wk("holder", 0), OverlapBlocks: 16, ReportedBlocks: 16, ActiveDecodeBlocks: 40, ActivePrefillTokens: tc.queued}
			idle := CandidateRow{Key: wk("idle", 0), ActivePrefillTokens: tc.queued}
			x, c := NewCandidates(&Request{Tokens: 20 * bs}, bs, 20, 1, nil, []CandidateRow{holder, idle})
			x.CachedShare, x.HeldShare = tc.share, tc.held
			cost := make([]float64, 2)
			DefaultCost{Params: tc.p}.Score(x, c, cost)
			for i := range cost {
				if math.Abs(cost[i]-tc.want[i]) > 1e-9 {
					t.Fatalf("costs %v, want %v", cost, tc.want)
				}
			}
			for _, temp := range []float64{0, 1e-9} { // the fused min and the sampling pass
				p := &DefaultPolicy{Cost: tc.p, Temperature: temp, NoOutputBlocks: true}
				if i, err := p.Select(x, c); err != nil || c.Key(i) != wk(tc.pick, 0) {
					t.Errorf("T=%v: picked %v (%v), want %s", temp, c.Key(i), err, tc.pick)
				}
			}
		})
	}
}

// naiveCachedShare is cachedShare's definition written out: the selections'
// overlap and prompt blocks, each weighted by keep^age, plus the prior's
// cachedSharePrior fully cached selections of their mean prompt, faded by
// keep^n.
func naiveCachedShare(sels [][2]int) float64 {
	keep := 1 - 1.0/cachedShareSpan
	var cached, prompt, count float64
	for _, s := range sels {
		cached, prompt, count = cached*keep+float64(s[0]), prompt*keep+float64(s[1]), count*keep+1
	}
	if count == 0 {
		return 1
	}
	prior := cachedSharePrior * math.Pow(keep, float64(len(sels))) * prompt / count
	return (cached + prior) / (prompt + prior)
}

func TestCachedShare(t *testing.T) {
	var s cachedShare
	if v := s.value(); v != 1 {
		t.Fatalf("empty estimate %v, want 1", v)
	}
	s.note(5, 0) // no prompt blocks: nothing learned
	if v := s.value(); v != 1 {
		t.Fatalf("after a blockless selection %v, want 1", v)
	}
	// The prior keeps a cold start near 1: one uncached selection moves it
	// by about 1/prior, not to 0.
	s.note(0, 4)
	if v, want := s.value(), naiveCachedShare([][2]int{{0, 4}}); math.Abs(v-want) > 1e-12 || v < 0.98 {
		t.Fatalf("after one uncached selection %v, want %v (about 1 - 1/%d)", v, want, cachedSharePrior)
	}
	// Against the naive model on a random sequence, with clamped overlaps
	// (negative counts as none, past the prompt as the prompt).
	rng := rand.New(rand.NewPCG(1, 2))
	s = cachedShare{}
	var sels [][2]int
	for i := range 3 * cachedShareSpan {
		p := 1 + rng.IntN(100)
		o := rng.IntN(p+20) - 10
		s.note(o, p)
		sels = append(sels, [2]int{min(max(o, 0), p), p})
		if v, want := s.value(), naiveCachedShare(sels); math.Abs(v-want) > 1e-9 {
			t.Fatalf("after %d selections %v, want %v", i+1, v, want)
		}
	}
	// A workload with a fifth cached reaches one half in about ninety
	// selections; one with most cached stays above it from the start.
	for _, tc := range []struct {
		cached, under int // overlap per 10 blocks; selections until below 0.5 (0: never in 1,000)
	}{{2, 89}, {7, 0}} {
		s = cachedShare{}
		n := 0
		for i := range 1000 {
			s.note(tc.cached, 10)
			if s.value() < 0.5 {
				n = i + 1
				break
			}
		}
		if n != tc.under {
			t.Errorf("%d/10 cached: below one half after %d selections, want %d", tc.cached, n, tc.under)
		}
	}
	// It forgets: after many uncached selections it is near 0.
	for range 20 * cachedShareSpan {
		s.note(0, 8)
	}
	if v := s.value(); v > 1e-6 {
		t.Fatalf("after %d uncached selections %v, want about 0", 20*cachedShareSpan, v)
	}
}

// TestSchedulerHandsCachedShare checks that a scheduler's selections see
// the cached share of the selections before them.
func TestSchedulerHandsCachedShare(t *testing.T) {
	var shares []float64
	p := &recordingPolicy{pick: func(x *Context, c *Candidates) int {
		shares = append(shares, x.CachedShare)
		return preferWorker("a")(x, c)
	}}
	h := newHarness(t, Config{BlockSize: 16}, p, wi("a", 0), wi("b", 0))
	if v := h.s.Stats().CachedShare; v != 1 {
		t.Fatalf("stats before any selection: cached share %v, want 1", v)
	}
	h.admitted(h.submit(&Request{ID: "r1", Tokens: 64, SeqHashes: hashes(4, 1), Overlaps: []Overlap{{Key: wk("a", 0), Blocks: 4}}}))
	h.admitted(h.submit(&Request{ID: "r2", Tokens: 64, SeqHashes: hashes(4, 2)}))
	h.admitted(h.submit(&Request{ID: "r3", Tokens: 64, SeqHashes: hashes(4, 3)}))
	want := []float64{1, 1, naiveCachedShare([][2]int{{4, 4}, {0, 4}})}
	if len(shares) != len(want) {
		t.Fatalf("saw %d selections, want %d", len(shares), len(want))
	}
	for i := range want {
		if math.Abs(shares[i]-want[i]) > 1e-12 {
			t.Fatalf("shares %v, want %v", shares, want)
		}
	}
	// The host's gauge reads it too, the last selection included.
	if v, w := h.s.Stats().CachedShare, naiveCachedShare([][2]int{{4, 4}, {0, 4}, {0, 4}}); math.Abs(v-w) > 1e-12 {
		t.Fatalf("stats: cached share %v, want %v", v, w)
	}
}
