package report

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/bench/metrics"
)

// quiet is a row on which no rule fires, even against itself as the best:
// 30 % hit predicted right, even load, few sessions moved, a short router
// queue.
func quiet(name, path string) metrics.Summary {
	return metrics.Summary{
		Policy: name, Path: path, Requests: 100, Done: 100,
		HitRatio: 0.30, OfUpperBound: 0.75, RouterHit: 0.30,
		TTFT:          metrics.Dist{N: 100, P50: 100, P99: 1000},
		Queue:         metrics.Dist{N: 100, P50: 1, P99: 5},
		RequestSpread: metrics.Spread{MaxOverMean: 1.05, CV: 0.03},
		PrefillSpread: metrics.Spread{MaxOverMean: 1.05, CV: 0.03},
		Sessions:      100, SessionsMoved: 5,
		LoadOverTime: []float64{1.1, 1.2, 1.1, 1.0, 1.3, 1.1, 1.2, 1.0, 1.1, 2.5},
	}
}

func whyReport(rows ...metrics.Summary) *Report {
	return &Report{Version: Version, Setup: Setup{Workers: 4, Speedup: 3}, Policies: rows}
}

// rulesFired are the rules that wrote a line about the named row, without
// the "wins" and "none" lines.
func rulesFired(r *Report, name, path string) ([]string, []finding) {
	p := r.PolicyOn(name, path)
	fs := whyFindings(p, r.peersOn(path))
	var rules []string
	for _, f := range fs {
		if f.rule != "wins" && f.rule != "none" {
			rules = append(rules, f.rule)
		}
	}
	return rules, fs
}

// Each rule fires when its figure crosses its threshold and not just
// short of it; the other row is the best of the path.
func TestWhyRules(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mutate   func(p *metrics.Summary)
		want     []string // rules fired
		wantText string   // in one of the lines
	}{
		{"nothing notable", func(p *metrics.Summary) {}, nil, "no loss stands out: hit ratio 30.0 % (75 % of the bound), TTFT p50 100 ms, p99 1000 ms, load max/mean 1.05, 5.0 % of sessions moved"},
		{"hit 1.5 pp below the best", func(p *metrics.Summary) { p.HitRatio, p.RouterHit = 0.285, 0.285 }, nil, "no loss stands out"},
		{"hit 2.5 pp below the best, index right", func(p *metrics.Summary) { p.HitRatio, p.RouterHit = 0.275, 0.28 },
			[]string{"cache-misses"}, "hit ratio 27.5 % = 75 % of the bound, 2.5 pp below the best (best 30.0 %); the router predicted 28.0 %, so the index was right and the loss is in the choices"},
		{"hit below the best, index wrong", func(p *metrics.Summary) { p.HitRatio, p.RouterHit = 0.25, 0.30 },
			[]string{"cache-misses", "index"}, "the index was wrong: the router predicted 30.0 % hit, the engines found 25.0 % (5.0 pp less)"},
		{"router over-predicts by 2 pp", func(p *metrics.Summary) { p.RouterHit = 0.32 }, nil, ""},
		{"router over-predicts by 4 pp", func(p *metrics.Summary) { p.RouterHit = 0.34 }, []string{"index"}, "(4.0 pp less)"},
		{"router under-predicts by 4 pp", func(p *metrics.Summary) { p.RouterHit = 0.26 }, []string{"index"}, "the index missed cached blocks"},
		{"sessions moved 4 pp above the lowest", func(p *metrics.Summary) { p.SessionsMoved = 9 }, nil, ""},
		{"sessions moved 6 pp above the lowest", func(p *metrics.Summary) { p.SessionsMoved = 11 }, []string{"cache-thrash"},
			"cache thrash: 11 of 100 sessions (11.0 %) were served by more than one worker, against 5.0 % for best"},
		{"no sessions", func(p *metrics.Summary) { p.Sessions, p.SessionsMoved = 0, 0 }, nil, ""},
		{"requests just below the spread thresholds", func(p *metrics.Summary) { p.RequestSpread = metrics.Spread{MaxOverMean: 1.24, CV: 0.14} }, nil, ""},
		{"requests max/mean at the threshold", func(p *metrics.Summary) { p.RequestSpread = metrics.Spread{MaxOverMean: 1.25, CV: 0.1} },
			[]string{"hot-requests"}, "the busiest worker served 1.25x the mean requests (CV 0.10); best: best 1.05x, CV 0.03"},
		{"requests CV at the threshold", func(p *metrics.Summary) { p.RequestSpread = metrics.Spread{MaxOverMean: 1.2, CV: 0.15} }, []string{"hot-requests"}, ""},
		{"prefill just below the spread thresholds", func(p *metrics.Summary) { p.PrefillSpread = metrics.Spread{MaxOverMean: 1.24, CV: 0.14} }, nil, ""},
		{"prefill max/mean at the threshold", func(p *metrics.Summary) { p.PrefillSpread = metrics.Spread{MaxOverMean: 1.3, CV: 0.1} },
			[]string{"hot-prefill"}, "computed 1.30x the mean prefill tokens"},
		{"busiest worker hot in 20 % of the run", func(p *metrics.Summary) { p.LoadOverTime[0] = 3 }, []string{"hot-over-time"},
			"held ≥ 2x the mean in-flight requests in 20 % of the run (peak 3.0x); best: best 10 %"},
		{"idle samples do not count", func(p *metrics.Summary) { p.LoadOverTime = []float64{0, 0, 0, 0, 0, 2.5, 1, 1, 1, 1} }, []string{"hot-over-time"}, "in 20 % of the run"},
		{"no load samples", func(p *metrics.Summary) { p.LoadOverTime = nil }, nil, ""},
		{"router queue 9 % of TTFT", func(p *metrics.Summary) { p.Queue.P50 = 3 }, nil, ""},
		{"router queue 12 % of TTFT p50", func(p *metrics.Summary) { p.Queue.P50 = 4 }, []string{"router-queue"},
			"queue wait p50 4.00 ms, p99 5.00 ms wall clock = 12.0 / 15.0 ms at the x3 speed-up, against TTFT p50 100 ms, p99 1000 ms"},
		{"router queue 10.2 % of TTFT p99", func(p *metrics.Summary) { p.Queue.P99 = 34 }, []string{"router-queue"}, "= 3.00 / 102 ms at the x3 speed-up"},
		{"TTFT p50 1.19x the best", func(p *metrics.Summary) { p.TTFT.P50 = 119 }, nil, ""},
		{"TTFT p50 1.21x the best", func(p *metrics.Summary) { p.TTFT.P50 = 121 }, []string{"ttft"},
			"queueing for the first token: TTFT p50 121 ms = 1.2x the best (best 100 ms)"},
		{"TTFT p99 1.5x the best", func(p *metrics.Summary) { p.TTFT.P99 = 1500 }, []string{"ttft"}, "TTFT p99 1500 ms = 1.5x the best (best 1000 ms)"},
		{"rejections by code", func(p *metrics.Summary) {
			p.Requests, p.Rejected, p.Failed = 103, 2, 1
			p.Codes = map[string]int{"overloaded": 1, "no_worker": 1, "failed": 1}
		}, []string{"rejections"}, "rejections: 2 rejected, 1 failed of 103 requests (failed 1, no_worker 1, overloaded 1)"},
		{"nothing served", func(p *metrics.Summary) {
			*p = metrics.Summary{Policy: p.Policy, Path: p.Path, Requests: 5, Rejected: 5, Codes: map[string]int{"overloaded": 5}}
		}, []string{"rejections"}, "5 rejected, 0 failed of 5 requests (overloaded 5)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := quiet("p", "nats")
			tc.mutate(&p)
			r := whyReport(quiet("best", "nats"), p)
			got, fs := rulesFired(r, "p", "nats")
			if !slices.Equal(got, tc.want) {
				t.Errorf("rules %v, want %v: %+v", got, tc.want, fs)
			}
			if tc.wantText != "" && !slices.ContainsFunc(fs, func(f finding) bool { return strings.Contains(f.text, tc.wantText) }) {
				t.Errorf("no line contains %q: %+v", tc.wantText, fs)
			}
			if best, _ := rulesFired(r, "best", "nats"); len(best) != 0 && tc.name != "nothing served" {
				t.Errorf("the best row got findings %v", best)
			}
		})
	}
}

// True-cache is quoted beside the best but is not the best itself, and the
// best row is told what it wins on.
func TestWhyTrueCacheAndWins(t *testing.T) {
	truth := quiet("true-cache", "nats")
	truth.HitRatio, truth.RouterHit, truth.TTFT.P50 = 0.40, 0.40, 50
	p := quiet("p", "nats")
	p.HitRatio, p.RouterHit, p.TTFT.P50 = 0.20, 0.20, 200
	r := whyReport(quiet("best", "nats"), p, truth)

	_, fs := rulesFired(r, "p", "nats")
	text := strings.Join(texts(fs), "\n")
	for _, want := range []string{"10.0 pp below the best (best 30.0 %), true-cache 40.0 %", "TTFT p50 200 ms = 2.0x the best (best 100 ms, true-cache 50.0 ms)"} {
		if !strings.Contains(text, want) {
			t.Errorf("p's lines lack %q:\n%s", want, text)
		}
	}
	_, fs = rulesFired(r, "best", "nats")
	if len(fs) != 2 || fs[0].text != "best of the path on hit ratio 30.0 %, TTFT p50 100 ms, TTFT p99 1000 ms" || fs[1].rule != "none" {
		t.Errorf("best's lines: %+v", fs)
	}
	got, fs := rulesFired(r, "true-cache", "nats")
	if len(got) != 0 || !strings.HasPrefix(fs[0].text, "ahead of every policy on hit ratio 40.0 %, TTFT p50 50.0 ms") {
		t.Errorf("true-cache's lines: %+v", fs)
	}
}

// With several paths the section groups rows by path and compares each
// with the best of its own path.
func TestWhyGroupsByPath(t *testing.T) {
	gwBest := quiet("sglang", "gateway")
	gwBest.HitRatio, gwBest.RouterHit = 0.50, 0.50
	gwKv := quiet("kvrouter", "gateway")
	gwKv.HitRatio, gwKv.RouterHit = 0.40, 0.40
	r := whyReport(quiet("kvrouter", "nats"), quiet("sglang", "nats"), gwKv, gwBest)
	r.Setup.Paths = []string{"nats", "gateway"}
	var b strings.Builder
	r.whySection(&b)
	md := b.String()
	nats, gw := strings.Index(md, "### Over the nats path"), strings.Index(md, "### Over the gateway path")
	if nats < 0 || gw < nats {
		t.Fatalf("paths not grouped in order:\n%s", md)
	}
	if i := strings.Index(md, "10.0 pp below the best (sglang 50.0 %)"); i < gw {
		t.Errorf("gateway kvrouter not compared with gateway sglang:\n%s", md)
	}
	if strings.Count(md, "no loss stands out") != 3 {
		t.Errorf("want the two nats rows and gateway sglang quiet:\n%s", md)
	}
}

// The section sits after Targets (or Results without targets) and before
// Notes.
func TestWhyPlacement(t *testing.T) {
	for _, tc := range []struct {
		name   string
		checks []Check
		after  string
	}{
		{"with targets", []Check{{Name: "x", Want: "1", Got: "1", Pass: true}}, "## Targets"},
		{"without targets", nil, "## Results"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := whyReport(quiet("kvrouter", "nats"), quiet("round-robin", "nats"))
			r.Checks, r.Notes = tc.checks, []string{"a note"}
			var b strings.Builder
			if err := r.Markdown(&b, nil); err != nil {
				t.Fatal(err)
			}
			md := b.String()
			after, why, notes := strings.Index(md, tc.after), strings.Index(md, "## Why each policy wins or loses"), strings.Index(md, "## Notes")
			if after < 0 || why < after || notes < why {
				t.Errorf("%s at %d, why at %d, notes at %d:\n%s", tc.after, after, why, notes, md)
			}
			if tc.checks == nil && strings.Contains(md, "## Targets") {
				t.Errorf("targets without checks:\n%s", md)
			}
		})
	}
	var b strings.Builder
	if err := (&Report{Version: Version}).Markdown(&b, nil); err != nil || strings.Contains(b.String(), "## Why") {
		t.Errorf("empty report: %v\n%s", err, b.String())
	}
}

// Over several runs the section says which figures are medians and which
// come from one run.
func TestWhyRunsNote(t *testing.T) {
	for _, runs := range []bool{false, true} {
		r := whyReport(quiet("kvrouter", "nats"), quiet("round-robin", "nats"))
		if runs {
			r.Policies[0].Runs = &metrics.RunSpread{N: 3}
		}
		var b strings.Builder
		r.whySection(&b)
		if got := strings.Contains(b.String(), "Over several runs every figure here is the median of the runs"); got != runs {
			t.Errorf("runs %v: note shown %v:\n%s", runs, got, b.String())
		}
	}
}

func texts(fs []finding) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.text
	}
	return out
}
