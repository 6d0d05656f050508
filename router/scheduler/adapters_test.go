package scheduler

import (
	"context"
	"testing"
)

// The adapter term: a candidate that does not hold the request's adapter
// pays AdapterLoadBlocks more prefill blocks (scaled as they are); one that
// holds it, or any candidate of a request without an adapter, pays
// nothing; 0 is the default weight and a negative one turns it off.
func TestAdapterCostTerm(t *testing.T) {
	for _, tc := range []struct {
		name     string
		p        CostParams
		adapter  string
		resident bool
		want     float64
	}{
		// (active 32 + ISL 64)/16 = 6 prefill blocks, nothing else
		{"no adapter", CostParams{PrefillLoadScale: 1, OverlapCredit: 1, AdapterLoadBlocks: 10}, "", false, 6},
		{"resident", CostParams{PrefillLoadScale: 1, OverlapCredit: 1, AdapterLoadBlocks: 10}, "sql", true, 6},
		{"not resident", CostParams{PrefillLoadScale: 1, OverlapCredit: 1, AdapterLoadBlocks: 10}, "sql", false, 16},
		{"scaled", CostParams{PrefillLoadScale: 2, OverlapCredit: 1, AdapterLoadBlocks: 10}, "sql", false, 32},
		{"default weight", CostParams{PrefillLoadScale: 1, OverlapCredit: 1}, "sql", false, 6 + DefaultAdapterLoadBlocks},
		{"off", CostParams{PrefillLoadScale: 1, OverlapCredit: 1, AdapterLoadBlocks: -1}, "sql", false, 6},
		// the cache credit cannot pay for the load: 6 − 10 clamps at 0, then + 10
		{"after the credit clamp", CostParams{PrefillLoadScale: 1, OverlapCredit: 10, AdapterLoadBlocks: 10}, "sql", false, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := []CandidateRow{
				{Key: wk("w", 0), ActivePrefillTokens: 32, AdapterResident: tc.resident},
				{Key: wk("holder", 0), AdapterResident: true}, // someone holds it: the term is on
			}
			if tc.name == "after the credit clamp" {
				rows[0].OverlapBlocks = 1
			}
			x, c := NewCandidates(&Request{Tokens: 64, Adapter: tc.adapter}, 16, 0, 1, nil, rows)
			cost := []float64{0, 0}
			DefaultCost{Params: tc.p}.Score(x, c, cost)
			if cost[0] != tc.want {
				t.Fatalf("cost %v, want %v", cost[0], tc.want)
			}
			if c.AdapterResident(0) != (tc.resident || tc.adapter == "") || !c.AdapterResident(1) {
				t.Fatalf("AdapterResident %v %v", c.AdapterResident(0), c.AdapterResident(1))
			}
		})
	}
}

// When no candidate holds the adapter every one would pay alike: the term
// is off and the fast loops run (same choice as without an adapter).
func TestAdapterTermOffWhenNobodyHoldsIt(t *testing.T) {
	x, c := NewCandidates(&Request{Tokens: 64, Adapter: "sql"}, 16, 0, 1, nil,
		[]CandidateRow{{Key: wk("a", 0), ActivePrefillTokens: 32}, {Key: wk("b", 0)}})
	if !c.plain() || c.AdapterResident(0) {
		t.Fatal("the adapter term is on although no candidate holds the adapter")
	}
	if i, err := NewDefaultPolicy(0).Select(x, c); err != nil || c.Key(i).Worker != "b" {
		t.Fatalf("picked %v (%v), want the idle b", c.Key(i), err)
	}
}

// The default policy, at temperature 0 and sampling: the
// holder wins over an idle worker while its extra queue is shorter than
// the load, and loses once the queue is longer.
func TestDefaultPolicyWeighsAdapterAgainstLoad(t *testing.T) {
	pick := func(holderQueue int, temp float64) string {
		rows := []CandidateRow{
			{Key: wk("cold", 0)},
			{Key: wk("holder", 0), ActivePrefillTokens: holderQueue, AdapterResident: true},
			{Key: wk("other", 0), ActivePrefillTokens: 4096},
		}
		x, c := NewCandidates(&Request{Tokens: 160, Adapter: "sql"}, 16, 0, 3, nil, rows)
		p := NewDefaultPolicy(temp)
		p.Cost.AdapterLoadBlocks = 64
		p.Cost.PrefillStepTokens = 0 // the queue alone against the adapter term
		i, err := p.Select(x, c)
		if err != nil {
			t.Fatal(err)
		}
		return c.Key(i).Worker
	}
	// 32 queued blocks < 64: the holder; 96 > 64: the idle cold worker.
	if got := pick(32*16, 0); got != "holder" {
		t.Fatalf("short queue: picked %s", got)
	}
	if got := pick(96*16, 0); got != "cold" {
		t.Fatalf("long queue: picked %s", got)
	}
	// Sampling at a low temperature over a wide cost range picks the
	// cheapest almost always.
	holder := 0
	for range 50 {
		if pick(8*16, 0.01) == "holder" {
			holder++
		}
	}
	if holder < 45 {
		t.Fatalf("sampling picked the holder %d times of 50", holder)
	}
}

// Through the scheduler: the host's AdapterResident names workers, and
// the request goes to the one holding its adapter although another is as
// idle; without the list it goes wherever the tie-break sends it.
func TestScheduleSteersToAdapterHolder(t *testing.T) {
	s := startScheduler(t, Config{}, NewDefaultPolicy(0), wi("a", 0), wi("b", 0), wi("c", 0))
	ctx := context.Background()
	for i := range 20 {
		d, err := s.Schedule(ctx, &Request{ID: "r" + string(rune('a'+i)), Tokens: 32, Adapter: "sql", AdapterResident: []string{"b", "gone"}})
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker.Worker != "b" {
			t.Fatalf("request %d went to %s, not to b which holds its adapter", i, d.Worker)
		}
		if err := s.Free(d.Fence); err != nil {
			t.Fatal(err)
		}
	}
}

// adapter_load_blocks in the default policy's YAML.
func TestAdapterLoadBlocksParam(t *testing.T) {
	p, err := NewRegistry().BuildYAML([]byte("name: default\nparams: {adapter_load_blocks: 12}"))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.(*DefaultPolicy).Cost.AdapterLoadBlocks; got != 12 {
		t.Fatalf("adapter_load_blocks %v", got)
	}
	if DynamoCostParams().AdapterLoadBlocks >= 0 {
		t.Fatal("the dynamo policy weighs adapters; Dynamo has no such term")
	}
}
