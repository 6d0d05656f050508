package replay

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/workers/sim"
)

func TestParseFleet(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Fleet
		err  bool
	}{
		{"", Fleet{}, false},
		{"4p4d", Fleet{4, 4}, false},
		{" 2P6D ", Fleet{2, 6}, false},
		{"4p", Fleet{}, true},
		{"0p4d", Fleet{}, true},
		{"4d4p", Fleet{}, true},
		{"xp4d", Fleet{}, true},
	} {
		got, err := ParseFleet(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseFleet(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrConfig) {
			t.Errorf("ParseFleet(%q): %v is not ErrConfig", tc.in, err)
		}
	}
	if s := (Fleet{4, 2}).String(); s != "4p2d" {
		t.Fatalf("String %q", s)
	}
}

// A split-fleet run with the fake stack: the PD policies run on the split
// fleet, each request's prefill leg (one token, on a prefill worker)
// before its decode leg (on a decode worker, with the blocks to pull),
// both bookings freed; the aggregated kvrouter runs on whole workers; the
// summary has the figures per side and the report its section.
func TestPDRunWithFakeStack(t *testing.T) {
	var stacks []*fakeStack
	w := smallWorkload()
	rep, err := Run(context.Background(), Config{
		Workload: w, NewStack: newFakeFactory(&stacks, 0), Fleet: Fleet{2, 2}, Speedup: 1000, MaxInFlight: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := PolicyNames(nil); got != "" {
		t.Fatal(got)
	}
	if len(stacks) != len(PDPolicies) || rep.Setup.Fleet != "2p2d" || rep.Setup.Workers != 4 {
		t.Fatalf("%d stacks, setup %+v", len(stacks), rep.Setup)
	}
	n := int64(len(w.Requests))
	for _, s := range stacks {
		pol := s.cfg.Policy
		if !pol.PD {
			if s.cfg.Fleet.Split() || s.prefillLegs+s.decodeLegs != 0 || s.frees.Load() != n {
				t.Fatalf("%s: fleet %v, %d+%d legs, %d frees", pol.Name, s.cfg.Fleet, s.prefillLegs, s.decodeLegs, s.frees.Load())
			}
			continue
		}
		if s.cfg.Fleet != (Fleet{2, 2}) || s.cfg.Workers != 4 || s.cfg.Transfer.BlockBytes != sim.DefaultTransferBlockBytes {
			t.Fatalf("%s: stack config %+v", pol.Name, s.cfg)
		}
		if int64(s.prefillLegs) != n || int64(s.decodeLegs) != n || s.wrongRole != 0 || s.unordered != 0 {
			t.Fatalf("%s: %d prefill and %d decode legs of %d, %d on the wrong role, %d decode legs first",
				pol.Name, s.prefillLegs, s.decodeLegs, n, s.wrongRole, s.unordered)
		}
		if s.routes.Load() != n || s.prefills.Load() != n || s.frees.Load() != 2*n || s.prefillFrees.Load() != n {
			t.Fatalf("%s: routes %d prefill_done %d frees %d (prefill %d)", pol.Name, s.routes.Load(), s.prefills.Load(), s.frees.Load(), s.prefillFrees.Load())
		}
		for id, got := range s.generated {
			if want := s.expected[id]; got < 1 || got > want {
				t.Fatalf("%s: decode leg %s generated %d tokens (max_tokens %d)", pol.Name, id, got, want)
			}
		}
	}
	kv, agg, rr := rep.Policy("kvrouter-pd"), rep.Policy("kvrouter"), rep.Policy("round-robin-pd")
	if agg.PD != nil || kv.PD == nil || rr.PD == nil {
		t.Fatalf("PD summaries: aggregated %v, split %v, round-robin %v", agg.PD, kv.PD, rr.PD)
	}
	for _, p := range []*metrics.Summary{kv, rr} {
		if p.PD.Split != len(w.Requests) || p.PD.Single != 0 || p.PD.DecodeHit <= 0 || p.PD.TransferBlocks <= 0 || p.PD.PrefillLeg.P50 <= 0 {
			t.Fatalf("%s: %+v", p.Policy, p.PD)
		}
		if p.PD.PrefillHit != p.HitRatio {
			t.Fatalf("%s: prefill-side hit %.3f, hit ratio %.3f", p.Policy, p.PD.PrefillHit, p.HitRatio)
		}
	}
	if kv.PD.PrefillHit <= rr.PD.PrefillHit || kv.PD.DecodeHit <= rr.PD.DecodeHit {
		t.Fatalf("KV-aware split hits %.3f/%.3f, round-robin pairing %.3f/%.3f", kv.PD.PrefillHit, kv.PD.DecodeHit, rr.PD.PrefillHit, rr.PD.DecodeHit)
	}
	var md strings.Builder
	if err := rep.Markdown(&md, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Prefill/decode split", "| kvrouter-pd | 2p2d |", "| kvrouter | 4 both |", "kvrouter-pd p99 TTFT lower than round-robin pairing's"} {
		if !strings.Contains(md.String(), want) {
			t.Fatalf("report lacks %q:\n%s", want, md.String())
		}
	}
}

func TestPDConfigErrors(t *testing.T) {
	pd, _ := LookupPolicies([]string{"kvrouter-pd"})
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"PD policy without a split fleet", Config{Policies: pd}},
		{"fleet size and workers differ", Config{Fleet: Fleet{2, 2}, Workers: 8}},
		{"negative bandwidth", Config{Fleet: Fleet{2, 2}, TransferGBps: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stacks []*fakeStack
			tc.cfg.Workload, tc.cfg.NewStack = smallWorkload(), newFakeFactory(&stacks, 0)
			if _, err := Run(context.Background(), tc.cfg); !errors.Is(err, ErrConfig) || len(stacks) != 0 {
				t.Fatalf("err %v after %d stacks, want ErrConfig before any", err, len(stacks))
			}
		})
	}
}

// The split checks: the load level on the aggregated fleet, and the
// KV-aware split against round-robin pairing; the aggregated peer checks
// are left out (no aggregated policy to be lowest among).
func TestPDChecks(t *testing.T) {
	row := func(name string, p99 float64, pd bool) metrics.Summary {
		s := metrics.Summary{Policy: name, Path: PathNATS, Done: 1, TTFT: metrics.Dist{P50: p99 / 2, P99: p99}}
		if pd {
			s.PD = &metrics.PDSummary{}
		}
		return s
	}
	rep := &report.Report{Unloaded: &metrics.Dist{P99: 100}, Policies: []metrics.Summary{
		row("kvrouter-pd", 1000, true), row("kvrouter", 600, false), row("round-robin-pd", 1600, true), row("round-robin", 400, false)}}
	got := map[string]bool{}
	for _, c := range pdChecks(rep) {
		got[c.Name] = c.Pass
	}
	want := map[string]bool{
		"load level: aggregated kvrouter p99 TTFT vs unloaded p99":    true,
		"kvrouter-pd p99 TTFT lower than round-robin pairing's":       true,
		"load level: aggregated round-robin p99 TTFT vs unloaded p99": false,
	}
	if len(got) != len(want) {
		t.Fatalf("checks %v, want %v", got, want)
	}
	for k, v := range want {
		if p, ok := got[k]; !ok || p != v {
			t.Fatalf("checks %v, want %v", got, want)
		}
	}
	rep.Policies[2].TTFT.P99 = 1400 // 1.4x: missed
	for _, c := range Checks(rep) {
		if strings.HasPrefix(c.Name, "kvrouter-pd") && c.Pass {
			t.Fatalf("%+v passed at 1.4x", c)
		}
	}
}

// round-robin-pd runs as the simple proxies it stands for: no router
// queue, whatever the run's threshold, and the report says so;
// round-robin-pd-queued and kvrouter-pd keep the run's threshold.
func TestRoundRobinPairingRunsWithoutRouterQueue(t *testing.T) {
	var stacks []*fakeStack
	pols, err := LookupPolicies([]string{"kvrouter-pd,round-robin-pd,round-robin-pd-queued"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), Config{Workload: smallWorkload(), NewStack: newFakeFactory(&stacks, 0),
		Policies: pols, Fleet: Fleet{2, 2}, Speedup: 1000, QueueThreshold: 8})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"kvrouter-pd": 8, "round-robin-pd": -1, "round-robin-pd-queued": 8}
	if len(stacks) != len(want) {
		t.Fatalf("%d stacks", len(stacks))
	}
	for _, s := range stacks {
		if th, ok := want[s.cfg.Policy.Name]; !ok || s.cfg.QueueThreshold != th {
			t.Errorf("%s: threshold %g, want %g", s.cfg.Policy.Name, s.cfg.QueueThreshold, th)
		}
	}
	notes := 0
	for _, n := range rep.Notes {
		if strings.Contains(n, "ran without a router queue") {
			notes++
			if !strings.HasPrefix(n, "round-robin-pd ran") {
				t.Errorf("note %q", n)
			}
		}
	}
	if notes != 1 {
		t.Fatalf("%d no-queue notes, want 1: %q", notes, rep.Notes)
	}
}
