package replay

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/router/scheduler"
)

// A policy tuned on an evaluation part is refused there, runs with
// AllowInSample marked IN-SAMPLE, and runs freely on a part its tuning did
// not touch; the report states the part either way.
func TestHeldOutRefusal(t *testing.T) {
	w := smallWorkload()
	w.Name = "mooncake:synthetic"
	pols, _ := LookupPolicies([]string{"kvrouter,round-robin"})
	// The synthetic trace's evaluation part starts at its request 1,926,
	// inside the 2,000 the default was tuned on.
	evalPart := &workload.PartInfo{Part: workload.PartEval, Workload: w.Name, Rule: "second half", First: 1925, End: 3993, Total: 3993}
	type result struct{ Notes []string }
	run := func(part *workload.PartInfo, allow bool) (*result, error) {
		var stacks []*fakeStack
		cfg := Config{Workload: w, Policies: pols, NewStack: newFakeFactory(&stacks, 0), Workers: 2, Speedup: 1e4, Part: part, AllowInSample: allow}
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			return nil, err
		}
		if rep.Workload.Part != part {
			t.Errorf("report part %+v, want %+v", rep.Workload.Part, part)
		}
		for _, p := range rep.Policies {
			want := allow && p.Policy == "kvrouter" && part == evalPart
			if p.InSample != want {
				t.Errorf("%s: in-sample %v, want %v", p.Policy, p.InSample, want)
			}
		}
		return &result{Notes: rep.Notes}, nil
	}
	_, err := run(evalPart, false)
	if !errors.Is(err, ErrInSample) || !strings.Contains(err.Error(), "kvrouter was tuned on requests of this eval part of mooncake:synthetic") || strings.Contains(err.Error(), "round-robin") {
		t.Fatalf("in-sample run not refused as it should be: %v", err)
	}
	cfg, err := run(evalPart, true)
	if err != nil || !notesContain(cfg.Notes, "IN-SAMPLE (runs only with --allow-in-sample): kvrouter") {
		t.Fatalf("allowed in-sample run: %v %q", err, cfg.Notes)
	}
	// The conversation trace's evaluation part starts past its head.
	conv := *evalPart
	conv.Workload, conv.First = "mooncake:conversation", 5606
	w.Name = conv.Workload
	if cfg, err := run(&conv, false); err != nil || !notesContain(cfg.Notes, "no policy here was tuned on it") {
		t.Fatalf("held-out run: %v", err)
	}
	tune := &workload.PartInfo{Part: workload.PartTune, Workload: w.Name, Rule: "first half", End: 5606, Total: 12031}
	if cfg, err := run(tune, false); err != nil || !notesContain(cfg.Notes, "TUNING PART") {
		t.Fatalf("tuning run: %v", err)
	}
	if cfg, err := run(nil, false); err != nil || !notesContain(cfg.Notes, "not a declared part") {
		t.Fatalf("undeclared run: %v", err)
	}
}

func notesContain(notes []string, s string) bool {
	for _, n := range notes {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// Every catalog entry that runs the default cost at the default weights
// (approximate mode and true-cache included) carries the default's tuning
// record, and no other entry does.
func TestTuningRecordsCoverTheDefault(t *testing.T) {
	reg := scheduler.NewRegistry()
	for _, p := range Catalog {
		pol, err := reg.Build(scheduler.PolicyConfig{Name: p.RouterPolicy, Params: p.RouterParams})
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		// The default of stops 45-52 was tuned too, and keeps its record.
		stop45 := scheduler.DefaultCostParams()
		stop45.DecodeFullShare, stop45.DecodeShareUntilHeld = 0, 0
		tuned := func(c scheduler.CostParams) bool { return c == scheduler.DefaultCostParams() || c == stop45 }
		isDefault := false
		switch x := pol.(type) {
		case *scheduler.DefaultPolicy:
			isDefault = tuned(x.Cost)
		case *scheduler.Pipeline:
			if c, ok := x.Scorers[0].Scorer.(scheduler.DefaultCost); ok && len(x.Scorers) == 1 {
				isDefault = tuned(c.Params)
			}
		}
		if got := len(TunedOn[p.Name]) > 0; got != isDefault {
			t.Errorf("%s: tuning record %v, runs the default at its weights %v", p.Name, got, isDefault)
		}
	}
	for name := range TunedOn {
		if _, ok := policyByName(name); !ok {
			t.Errorf("tuning record for %q, not in the catalog", name)
		}
	}
}

func TestParameterisedPolicies(t *testing.T) {
	cases := []struct {
		arg     string
		names   []string
		wantErr bool
	}{
		{arg: "kvrouter{overlap_credit=2,decode_block_weight=1},llmd", names: []string{"kvrouter{overlap_credit=2,decode_block_weight=1}", "llmd"}},
		{arg: "kvrouter, kvrouter{overlap_credit=3}", names: []string{"kvrouter", "kvrouter{overlap_credit=3}"}},
		{arg: "kvrouter{overlap_credit}", wantErr: true},
		{arg: "kvrouter{overlap_credit=2", wantErr: true},
		{arg: "nosuch{a=1}", wantErr: true},
	}
	for _, c := range cases {
		pols, err := LookupPolicies([]string{c.arg})
		if (err != nil) != c.wantErr {
			t.Fatalf("%q: err %v, want error %v", c.arg, err, c.wantErr)
		}
		if c.wantErr {
			continue
		}
		var got []string
		for _, p := range pols {
			got = append(got, p.Name)
		}
		if strings.Join(got, "|") != strings.Join(c.names, "|") {
			t.Fatalf("%q: policies %q, want %q", c.arg, got, c.names)
		}
	}
	pols, err := LookupPolicies([]string{"kvrouter{overlap_credit=2}"})
	if err != nil {
		t.Fatal(err)
	}
	if pols[0].RouterPolicy != "default" || len(pols[0].RouterParams.Content) != 2 || pols[0].RouterParams.Content[1].Value != "2" {
		t.Fatalf("parameters not carried: %+v", pols[0])
	}
	// A variant carries its base entry's tuning record.
	p := &workload.PartInfo{Workload: "synthetic:rag", Part: workload.PartTune}
	if got := inSample(pols, p); len(got["kvrouter{overlap_credit=2}"]) == 0 {
		t.Fatalf("variant has no tuning record on rag's tuning part: %v", got)
	}
}
