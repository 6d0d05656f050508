package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/bench/replay"
	"github.com/kvrouter/kvrouter/bench/report"
	"github.com/kvrouter/kvrouter/bench/stack"
	"github.com/kvrouter/kvrouter/bench/workload"
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
		t.Fatalf("report: %v %+v\nlog:\n%s", err, rep.Policies, errb.String())
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
		{"replay", "--workload", "rag", "--part", "test"},
		{"replay", "--workload", "rag", "--seed", "101"},
		{"replay", "--workload", "rag", "--part", "tune", "--seed", "99", "--runs", "3", "--samples", "--describe"},
		{"replay", "--workload", "rag", "--part", "tune", "--samples", "--calibrate"},
		{"replay", "--workload", "rag", "--calibrate", "--calibrate-targets", "3,x"},
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

// The held-out protocol from the command line: --describe states the part
// and the bound; a policy tuned on the evaluation part is refused before
// anything starts; --part tune of a generated workload is another seed.
func TestBenchReplayHeldOut(t *testing.T) {
	dir := t.TempDir()
	// A 100-request stand-in for the synthetic trace: its evaluation part
	// starts at request 51, inside the default's 2,000-request tuning head.
	var trace strings.Builder
	for i := range 100 {
		fmt.Fprintf(&trace, `{"timestamp":%d,"input_length":600,"output_length":20,"hash_ids":[%d,%d]}`+"\n", i*1000, 2*i, 2*i+1)
	}
	path := filepath.Join(dir, "mooncake_fast25_synthetic_trace.jsonl")
	if err := os.WriteFile(path, []byte(trace.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := benchMain(context.Background(), []string{"replay", "--trace", path, "--describe"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"mooncake:synthetic, eval part", "requests 51-100 of 100", "max_tokens 2048", "infinite-cache bound", "IN-SAMPLE"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--describe lacks %q:\n%s", want, out.String())
		}
	}
	err := benchMain(context.Background(), []string{"replay", "--trace", path, "--policies", "kvrouter,round-robin", "--quiet", "--out", dir}, &out, &errb)
	if !errors.Is(err, replay.ErrInSample) {
		t.Fatalf("in-sample replay: %v", err)
	}
	out.Reset()
	if err := benchMain(context.Background(), []string{"replay", "--trace", path, "--part", "tune", "--describe"}, &out, &errb); err != nil ||
		!strings.Contains(out.String(), "tune part") || !strings.Contains(out.String(), "TUNING PART") {
		t.Fatalf("tuning part: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := benchMain(context.Background(), []string{"replay", "--workload", "burst", "--part", "tune", "--seed", "2", "--describe"}, &out, &errb); err != nil ||
		!strings.Contains(out.String(), "this is seed 2") {
		t.Fatalf("generated tuning part: %v\n%s", err, out.String())
	}
}

// --samples gives run r the workload generated from seed --seed + r, the
// part and slice the same; without it every run replays the one sample;
// a trace is one sample and refuses it.
func TestBenchReplaySamples(t *testing.T) {
	config := func(args ...string) (replay.Config, error) {
		c := benchFlags("kvrouter bench replay", benchReplayAbout, io.Discard, io.Discard)
		f := addBenchReplayFlags(c)
		if err := c.parse(args); err != nil {
			t.Fatal(err)
		}
		f.given = map[string]bool{}
		return f.config(io.Discard)
	}
	cfg, err := config("--workload", "chat", "--part", "tune", "--seed", "5", "--runs", "3", "--limit", "40", "--samples")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Samples) != 3 || cfg.Samples[0] != cfg.Workload {
		t.Fatalf("%d samples, first the workload: %v", len(cfg.Samples), len(cfg.Samples) > 0 && cfg.Samples[0] == cfg.Workload)
	}
	want, _, err := workload.GeneratePart("chat", workload.PartTune, 7)
	if err != nil {
		t.Fatal(err)
	}
	want = want.Select(40, 0, 0)
	got := cfg.Samples[2]
	if len(got.Requests) != len(want.Requests) || !slices.Equal(got.Requests[0].Tokens, want.Requests[0].Tokens) ||
		slices.Equal(got.Requests[0].Tokens, cfg.Samples[0].Requests[0].Tokens) {
		t.Fatalf("sample 3 is not seed 7's first 40 requests")
	}
	if cfg, err = config("--workload", "chat", "--part", "tune", "--runs", "3"); err != nil || cfg.Samples != nil {
		t.Fatalf("without --samples: %d samples, %v", len(cfg.Samples), err)
	}
	trace := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp":0,"input_length":600,"output_length":20,"hash_ids":[1,2]}`+"\n"+
		`{"timestamp":5000,"input_length":600,"output_length":20,"hash_ids":[1,3]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config("--trace", trace, "--part", "tune", "--runs", "2", "--samples"); err == nil || !strings.Contains(err.Error(), "--samples") {
		t.Fatalf("a trace with --samples: %v", err)
	}
}

// bench replay --cpuprofile profiles the whole replay, and on the gateway
// path the components' goroutines carry their label: the profile's string
// table names the label key and component values.
func TestBenchReplayCPUProfile(t *testing.T) {
	if testing.Short() {
		t.Skip("replays over the gateway path")
	}
	// The profiler samples at 100 Hz and the router's share of a short
	// replay is a few percent, so one replay can miss it by chance (it did
	// once in a full test run): a component is found when any of up to
	// three replays' profiles names it.
	missing := map[string]bool{"engine": true, "gateway": true, "router": true}
	for try := 0; try < 3 && len(missing) > 0; try++ {
		data := replayProfile(t)
		if !bytes.Contains(data, []byte(stack.ComponentLabel)) {
			t.Fatalf("the profile carries no %s label (%d bytes)", stack.ComponentLabel, len(data))
		}
		// A string table entry is field 6, length-delimited: 0x32, its
		// length, its bytes; function names only contain these words.
		for c := range missing {
			if bytes.Contains(data, append([]byte{0x32, byte(len(c))}, c...)) {
				delete(missing, c)
			}
		}
	}
	for c := range missing {
		t.Errorf("no sample in three replays carries %s=%s", stack.ComponentLabel, c)
	}
}

// replayProfile runs a short gateway-path replay with --cpuprofile and
// returns the decompressed profile.
func replayProfile(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	prof := filepath.Join(dir, "cpu.prof")
	var out, errb bytes.Buffer
	err := benchMain(context.Background(), []string{"replay", "--workload", "shared-prefix", "--limit", "40", "--workers", "2",
		"--speedup", "20", "--policies", "kvrouter", "--path", "gateway", "--out", dir, "--quiet", "--cpuprofile", prof}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	f, err := os.Open(prof)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("the profile is not gzipped: %v", err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
