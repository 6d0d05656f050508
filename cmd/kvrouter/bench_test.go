package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/bench/report"
)

func TestBenchReplaySyntheticAndRender(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	err := benchMain(context.Background(), []string{"replay", "--workload", "shared-prefix", "--limit", "40", "--workers", "2",
		"--speedup", "50", "--policies", "kvrouter,round-robin", "--max-output", "8", "--out", dir, "--quiet"}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), "round-robin") || !strings.Contains(out.String(), "wrote report.md") {
		t.Fatalf("stdout:\n%s", out.String())
	}
	data, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep report.Report
	if err := json.Unmarshal(data, &rep); err != nil || len(rep.Policies) != 2 || rep.Policies[0].Done != 40 {
		t.Fatalf("report: %v %+v", err, rep.Policies)
	}
	out.Reset()
	other := t.TempDir()
	if err := benchMain(context.Background(), []string{"render", "--in", filepath.Join(dir, "report.json"), "--out", other}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"report.md", "report.json", "ttft_cdf.png", "hit_ratio.png", "worker_load.png"} {
		if _, err := os.Stat(filepath.Join(other, f)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBenchMicroFromFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "bench.txt")
	os.WriteFile(in, []byte("pkg: github.com/kvrouter/kvrouter/router/index\nBenchmarkLookup/hit1-2 1000 4000 ns/op 25 ns/matched-block 0 B/op 0 allocs/op\n"), 0o644)
	md := filepath.Join(dir, "docs", "benchmarks.md")
	var out, errb bytes.Buffer
	if err := benchMain(context.Background(), []string{"micro", "--in", in, "--out", md, "--note", "test"}, &out, &errb); err != nil {
		t.Fatalf("%v %s", err, errb.String())
	}
	b, err := os.ReadFile(md)
	if err != nil || !strings.Contains(string(b), "`router/index.Lookup/hit1` | 4 µs/op | ≤ 5 µs/op | met") {
		t.Fatalf("%v\n%s", err, b)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{
		{},
		{"nope"},
		{"replay", "--session-mode", "sticky"},
		{"replay", "--policies", "nope"},
		{"replay", "--trace", "x.jsonl", "--workload", "chat"},
		{"replay", "--trace", filepath.Join(t.TempDir(), "missing.jsonl")},
		{"replay", "--workload", "nope"},
		{"replay", "extra"},
		{"render"},
		{"micro", "--in", filepath.Join(t.TempDir(), "missing.txt")},
	} {
		if err := benchMain(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	for _, args := range [][]string{{"help"}, {"replay", "-h"}, {"micro", "--help"}} {
		if err := benchMain(context.Background(), args, &out, &errb); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	t.Setenv("KVR_SESSION_MODE", "bogus")
	if err := benchMain(context.Background(), []string{"replay", "--workload", "chat"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("env var not applied: %v", err)
	}
}
