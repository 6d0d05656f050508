package micro

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const sample = `goos: linux
goarch: amd64
pkg: github.com/kvrouter/kvrouter/router/index
cpu: Intel(R) Xeon(R) CPU @ 2.20GHz
BenchmarkLookup/128blocks-2   	  300000	      4000 ns/op	        25.0 ns/block	       0 B/op	       0 allocs/op
BenchmarkLookup/128blocks-2   	  300000	      6000 ns/op	        35.0 ns/block	       0 B/op	       0 allocs/op
BenchmarkLookup/128blocks-2   	  300000	      4500 ns/op	        28.0 ns/block	       0 B/op	       0 allocs/op
BenchmarkApply-2              	 1000000	      150 ns/op	   6.5e+06 blocks/s	      16 B/op	       1 allocs/op
some log line the parser ignores
PASS
ok  	github.com/kvrouter/kvrouter/router/index	12.1s
pkg: github.com/kvrouter/kvrouter/kvevents
BenchmarkDecodeVLLM-2   	  500000	      3500 ns/op	     512 B/op	       3 allocs/op
--- FAIL: BenchmarkBroken
FAIL	github.com/kvrouter/kvrouter/kvevents	1.0s
`

func TestParse(t *testing.T) {
	res, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if res.GOOS != "linux" || res.CPU != "Intel(R) Xeon(R) CPU @ 2.20GHz" || len(res.Benches) != 3 || len(res.Failed) != 2 {
		t.Fatalf("%+v", res)
	}
	l := res.Find("router/index", "Lookup/128blocks")
	if l == nil || l.Procs != 2 || len(l.Iters) != 3 {
		t.Fatalf("%+v", l)
	}
	if m, _ := l.Median("ns/op"); m != 4500 {
		t.Fatalf("median %v", m)
	}
	if s := l.Spread("ns/op"); s < 0.33 || s > 0.34 {
		t.Fatalf("spread %v", s)
	}
	if m, ok := l.Median("ns/block"); !ok || m != 28 {
		t.Fatalf("ns/block %v", m)
	}
	if u := l.Units(); strings.Join(u, ",") != "ns/op,B/op,allocs/op,ns/block" {
		t.Fatalf("units %v", u)
	}
	if _, ok := l.Median("nope"); ok {
		t.Fatal("unknown unit")
	}
}

func TestParseErrors(t *testing.T) {
	if _, err := Parse(strings.NewReader("BenchmarkX-2 10 abc ns/op\n")); !errors.Is(err, ErrParse) {
		t.Fatalf("%v", err)
	}
	if _, err := Parse(strings.NewReader("Benchmark" + strings.Repeat("x", 5<<20))); !errors.Is(err, ErrParse) {
		t.Fatalf("long line: %v", err)
	}
}

func TestMedianEven(t *testing.T) {
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Fatal(m)
	}
}

func TestEvaluateAndMarkdown(t *testing.T) {
	res, _ := Parse(strings.NewReader(sample))
	targets := []Target{
		{Issue: 3, Goal: "lookup", Package: "router/index", Bench: `(?i)lookup`, Unit: "ns/op", Max: 5000},
		{Issue: 3, Goal: "per block", Package: "router/index", Bench: `(?i)lookup`, Unit: "ns/block", Max: 25},
		{Issue: 3, Goal: "apply", Package: "router/index", Bench: `(?i)apply`, Unit: "blocks/s", Min: 5e6},
		{Issue: 2, Goal: "decode allocs", Package: "kvevents", Bench: `(?i)decode`, Unit: "allocs/op", Max: 2},
		{Issue: 9, Goal: "absent", Package: "nowhere", Bench: `x`, Unit: "ns/op", Max: 1},
	}
	rows := Evaluate(res, targets)
	want := []bool{true, false, true, false, false}
	if len(rows) != len(want) {
		t.Fatalf("%d rows", len(rows))
	}
	for i, r := range rows {
		if r.Met != want[i] {
			t.Fatalf("row %d (%s): met %v value %v", i, r.Target.Goal, r.Met, r.Value)
		}
	}
	if rows[4].Bench != nil {
		t.Fatal("absent target matched")
	}
	var b bytes.Buffer
	d := Doc{Machine: Machine{CPU: "cpu X", Cores: 2, GoVersion: "go1.26", OS: "linux/amd64", Date: time.Unix(0, 0), Note: "shared VM"}, Command: "go test", Count: 3, Results: res, Targets: targets}
	if err := Markdown(&b, d); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, s := range []string{"cpu X, 2 logical CPUs", "| 3 | lookup | `router/index.Lookup/128blocks` | 4.5 µs/op | ≤ 5 µs/op | met |", "**missed**", "not measured", "### router/index", "| Lookup/128blocks | 3 | 4.5 µs ±33% | 0 | 0 | 28 ns/block |", "6.5M blocks/s", "## Failures"} {
		if !strings.Contains(md, s) {
			t.Fatalf("markdown lacks %q:\n%s", s, md)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		v    float64
		unit string
		want string
	}{
		{19.64, "ns/op", "19.64 ns/op"}, {42374, "ns/op", "42.37 µs/op"}, {2.5e6, "ns/op", "2.5 ms/op"},
		{0, "allocs/op", "0 allocs/op"}, {5e6, "blocks/s", "5M blocks/s"}, {20000, "routes/s", "20k routes/s"}, {60, "p50-µs", "60 p50-µs"},
	} {
		if got := Format(c.v, c.unit); got != c.want {
			t.Fatalf("Format(%v, %s) = %q want %q", c.v, c.unit, got, c.want)
		}
	}
}

func TestTargetsCompile(t *testing.T) {
	for _, tg := range Targets {
		_ = tg.re()
		if tg.Unit == "" || tg.Goal == "" || (tg.Max == 0 && tg.Min == 0 && tg.Unit != "allocs/op") {
			t.Fatalf("incomplete target %+v", tg)
		}
	}
}

func TestMachine(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "cpuinfo")
	os.WriteFile(p, []byte("processor\t: 0\nmodel name\t: Test CPU 9000\n"), 0o644)
	if m := cpuModel(p); m != "Test CPU 9000" {
		t.Fatal(m)
	}
	if m := cpuModel(filepath.Join(dir, "none")); m != "" {
		t.Fatal(m)
	}
	if m := ThisMachine("fallback"); m.CPU == "" || m.Cores < 1 || m.GoVersion == "" {
		t.Fatalf("%+v", m)
	}
}

func TestRunArgsAndFailure(t *testing.T) {
	o := RunOptions{Count: 3, Benchtime: "100ms", Packages: []string{"./x/..."}}
	if got := strings.Join(o.Args(), " "); got != "test -p 1 -run ^$ -bench . -benchmem -count 3 -timeout 30m -benchtime 100ms ./x/..." {
		t.Fatal(got)
	}
	_, err := Run(context.Background(), RunOptions{GoBin: filepath.Join(t.TempDir(), "no-go")}, nil)
	if !errors.Is(err, ErrRun) {
		t.Fatal(err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(sample))
	f.Add([]byte("BenchmarkX-2 1 1 ns/op 2"))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := Parse(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrParse) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		for _, b := range res.Benches {
			for _, u := range b.Units() {
				b.Median(u)
				b.Spread(u)
			}
		}
		var out bytes.Buffer
		_ = Markdown(&out, Doc{Results: res, Targets: Targets})
	})
}

// A regeneration keeps the hand-written sections of the file it replaces
// and drops the old generated tables.
func TestKeptSections(t *testing.T) {
	hand := KeptBegin + "\n\n## Issue 24: by hand\n\nfigures\n\n" + KeptEnd
	prev := "# Benchmarks\n\nold header\n\n" + hand + "\n\n## Targets from the issues\n\nold table\n"
	cases := []struct {
		name, prev, want string
	}{
		{"kept", prev, hand},
		{"no markers", "# Benchmarks\n\nold table\n", ""},
		{"no end marker", KeptBegin + "\n## Issue 1\n", ""},
	}
	for _, c := range cases {
		if got := Kept(c.prev); got != c.want {
			t.Fatalf("%s: Kept = %q, want %q", c.name, got, c.want)
		}
	}
	res, _ := Parse(strings.NewReader(sample))
	var b bytes.Buffer
	if err := Markdown(&b, Doc{Results: res, Kept: Kept(prev)}); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if !strings.Contains(md, "## Issue 24: by hand\n\nfigures") || strings.Contains(md, "old table") {
		t.Fatalf("regenerated file:\n%s", md)
	}
	if strings.Index(md, "## Issue 24") > strings.Index(md, "## Targets from the issues") {
		t.Fatal("hand-written sections must come before the generated tables")
	}
}
