package report

import (
	"bytes"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/workload"
)

func sample() *Report {
	var pols []metrics.Summary
	for i, name := range []string{"kvrouter", "round-robin", "true-cache"} {
		var recs []metrics.Record
		for j := 0; j < 50; j++ {
			recs = append(recs, metrics.Record{
				ID: "r", Worker: "w" + string(rune('0'+j%4)), Arrival: time.Duration(j) * time.Millisecond,
				PromptTokens: 160, PromptBlocks: 10, CachedBlocks: (j + i) % 10, OutputTokens: 5,
				TTFT: time.Duration(j*(i+1)+1) * time.Millisecond, ITL: time.Millisecond, E2E: time.Duration(j+10) * time.Millisecond,
				Route: time.Duration(j) * time.Microsecond,
			})
		}
		pols = append(pols, metrics.Summarize(recs, metrics.Options{Policy: name, UpperBound: 0.6, BlockSize: 16}))
	}
	return &Report{
		Version: Version, Title: "test", Created: time.Unix(0, 0),
		Workload: Workload{Name: "w", LoadScale: 1, UpperBound: workload.Bound{BlockSize: 16, PromptBlocks: 10, ReusableBlocks: 6, Ratio: 0.6}},
		Setup:    Setup{Workers: 4, Replicas: 1, BlockSize: 16, Speedup: 10, SessionMode: "none"},
		Policies: pols,
		Checks:   []Check{{Name: "x", Want: "≥ 1", Got: "2", Pass: true}, {Name: "y", Want: "≥ 3", Got: "2"}},
		Notes:    []string{"a note"},
	}
}

func TestWriteAll(t *testing.T) {
	dir := t.TempDir()
	r := sample()
	f, err := r.WriteAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(f.JSON)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	back, err := ReadJSON(fh)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Policies) != 3 || back.Policy("true-cache") == nil || back.Policy("true-cache").TTFT != r.Policy("true-cache").TTFT {
		t.Fatalf("round trip: %+v", back.Policies)
	}
	if len(f.Charts) != 4 {
		t.Fatalf("charts %v", f.Charts)
	}
	for _, c := range f.Charts {
		img, err := os.Open(c)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(img)
		img.Close()
		if err != nil || cfg.Width < 100 {
			t.Fatalf("%s: %v %+v", c, err, cfg)
		}
	}
	md, _ := os.ReadFile(f.Markdown)
	for _, want := range []string{"| kvrouter |", "![ttft_cdf](ttft_cdf.png)", "**missed**", "a note", "upper bound | 60.0 %"} {
		if !strings.Contains(string(md), want) {
			t.Fatalf("markdown lacks %q:\n%s", want, md)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "report.json.tmp")); !os.IsNotExist(err) {
		t.Fatal("temp file left behind")
	}
}

func TestTable(t *testing.T) {
	var b bytes.Buffer
	if err := sample().Table(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "round-robin") || !strings.Contains(out, "MISS  y") || !strings.Contains(out, "PASS  x") {
		t.Fatal(out)
	}
}

func TestEmptyReportCharts(t *testing.T) {
	r := &Report{Version: Version}
	if _, err := r.WriteAll(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

func TestReadJSONErrors(t *testing.T) {
	if _, err := ReadJSON(strings.NewReader("{")); !errors.Is(err, ErrReport) {
		t.Fatal(err)
	}
	if _, err := ReadJSON(strings.NewReader(`{"version":99}`)); !errors.Is(err, ErrReport) {
		t.Fatal(err)
	}
}

// With two paths the Markdown labels rows by path and puts kvrouter's
// figures over each path side by side; medians over runs show their spread.
func TestMarkdownPathsAndRuns(t *testing.T) {
	r := sample()
	r.Setup.Paths, r.Setup.Runs = []string{"nats", "gateway"}, 3
	for i := range r.Policies {
		r.Policies[i].Path = "nats"
	}
	gw := r.Policies[0]
	gw.Path, gw.TTFT.P99 = "gateway", 777
	low := 0.4321
	gw.CachedShareLow = &low
	gw.Runs = &metrics.RunSpread{N: 3, HitRatio: [2]float64{0.1, 0.3}, TTFTP50: [2]float64{1, 2}, TTFTP99: [2]float64{700, 800}, E2EP50: [2]float64{3, 4},
		PooledTTFT: metrics.Dist{N: 30, P50: 1.5, P90: 600, P99: 790, Max: 801}}
	r.Policies = append(r.Policies, gw)
	var b bytes.Buffer
	if err := r.Markdown(&b, nil); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{"## kvrouter over each path", "| gateway | ", "777 ms [700, 800]", "[10.0, 30.0]", "| path | nats (route API",
		"## TTFT pooled over the 3 runs", "| kvrouter (gateway) | 30 | 1.50 ms | 600 ms | 790 ms | 801 ms |",
		"## The routers' cached-share estimate", "| kvrouter (gateway) | 0.432 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if got := r.PolicyOn("kvrouter", "gateway"); got == nil || got.TTFT.P99 != 777 {
		t.Fatalf("PolicyOn gateway: %+v", got)
	}
	if l := gw.Label(true); l != "kvrouter (gateway)" {
		t.Fatalf("label %q", l)
	}
}

// Merging a gateway run into a nats run keeps every row with its path and
// both paths in the setup; another workload is refused.
func TestMerge(t *testing.T) {
	a, b := sample(), sample()
	b.Setup.Paths = []string{"gateway"}
	for i := range b.Policies {
		b.Policies[i].Path = "gateway"
	}
	if err := a.Merge(b); err != nil {
		t.Fatal(err)
	}
	if len(a.Policies) != 6 || len(a.Setup.Paths) != 2 || a.PolicyOn("kvrouter", "gateway") == nil || a.PolicyOn("kvrouter", "nats") == nil {
		t.Fatalf("merged: paths %v, %d rows", a.Setup.Paths, len(a.Policies))
	}
	var tb bytes.Buffer
	if err := a.ReadmeTable(&tb); err != nil || !strings.Contains(tb.String(), "| kvrouter | gateway |") {
		t.Fatalf("readme table: %v\n%s", err, tb.String())
	}
	c := sample()
	c.Workload.Name = "other"
	if err := a.Merge(c); !errors.Is(err, ErrReport) {
		t.Fatalf("merging another workload: %v", err)
	}
}
