package micro

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// ErrParse reports benchmark output that cannot be read.
var ErrParse = errors.New("micro: parse")

// Bench is one benchmark with every sample of every unit it reported.
type Bench struct {
	Package string               // import path
	Name    string               // without the "Benchmark" prefix and the -GOMAXPROCS suffix
	Procs   int                  // GOMAXPROCS suffix (0 if absent)
	Samples map[string][]float64 // unit -> one value per run
	Iters   []int64
}

// Median of a unit over the runs, and whether the unit was reported.
func (b *Bench) Median(unit string) (float64, bool) {
	v := b.Samples[unit]
	if len(v) == 0 {
		return 0, false
	}
	return median(v), true
}

// Spread is the largest relative deviation from the median, the "±x%"
// benchstat prints (0 when there is one run).
func (b *Bench) Spread(unit string) float64 {
	v := b.Samples[unit]
	if len(v) < 2 {
		return 0
	}
	m := median(v)
	if m == 0 {
		return 0
	}
	d := 0.0
	for _, x := range v {
		d = math.Max(d, math.Abs(x-m)/m)
	}
	return d
}

// Units lists the reported units, the standard ones first.
func (b *Bench) Units() []string {
	var out []string
	for _, u := range []string{"ns/op", "B/op", "allocs/op"} {
		if _, ok := b.Samples[u]; ok {
			out = append(out, u)
		}
	}
	var extra []string
	for u := range b.Samples {
		if u != "ns/op" && u != "B/op" && u != "allocs/op" {
			extra = append(extra, u)
		}
	}
	sort.Strings(extra)
	return append(out, extra...)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Results is a parsed run.
type Results struct {
	GOOS, GOARCH, CPU string
	Benches           []*Bench // in first-seen order
	Failed            []string // packages whose benchmarks failed ("FAIL" lines)
}

// Find returns the benchmark of that package suffix and name, or nil.
func (r *Results) Find(pkgSuffix, name string) *Bench {
	for _, b := range r.Benches {
		if b.Name == name && strings.HasSuffix(b.Package, pkgSuffix) {
			return b
		}
	}
	return nil
}

// Parse reads `go test -bench` output (any number of packages and -count
// runs). Lines it does not understand are ignored, as benchstat does.
func Parse(rd io.Reader) (*Results, error) {
	res := &Results{}
	index := make(map[string]*Bench)
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	pkg := ""
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		switch {
		case strings.HasPrefix(text, "goos: "):
			res.GOOS = strings.TrimPrefix(text, "goos: ")
			continue
		case strings.HasPrefix(text, "goarch: "):
			res.GOARCH = strings.TrimPrefix(text, "goarch: ")
			continue
		case strings.HasPrefix(text, "cpu: "):
			res.CPU = strings.TrimPrefix(text, "cpu: ")
			continue
		case strings.HasPrefix(text, "pkg: "):
			pkg = strings.TrimPrefix(text, "pkg: ")
			continue
		case strings.HasPrefix(text, "FAIL\t") || strings.HasPrefix(text, "--- FAIL: Benchmark"):
			res.Failed = append(res.Failed, strings.TrimSpace(text))
			continue
		case !strings.HasPrefix(text, "Benchmark"):
			continue
		}
		f := strings.Fields(text)
		// name iterations value unit [value unit]...
		if len(f) < 4 || len(f)%2 != 0 {
			continue
		}
		iters, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		name, procs := splitProcs(strings.TrimPrefix(f[0], "Benchmark"))
		key := pkg + "\x00" + name
		b := index[key]
		if b == nil {
			b = &Bench{Package: pkg, Name: name, Procs: procs, Samples: make(map[string][]float64)}
			index[key] = b
			res.Benches = append(res.Benches, b)
		}
		b.Iters = append(b.Iters, iters)
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%w: line %d: value %q of unit %q: %w", ErrParse, line, f[i], f[i+1], err)
			}
			b.Samples[f[i+1]] = append(b.Samples[f[i+1]], v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %w", ErrParse, line+1, err)
	}
	return res, nil
}

func splitProcs(name string) (string, int) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name, 0
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil || n <= 0 {
		return name, 0
	}
	return name[:i], n
}
