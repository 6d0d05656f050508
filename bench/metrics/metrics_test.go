package metrics

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5}
	for _, c := range []struct{ q, want float64 }{{0, 1}, {0.5, 3}, {1, 5}, {0.25, 2}, {0.9, 4.6}} {
		if got := Quantile(v, c.q); math.Abs(got-c.want) > 1e-9 {
			t.Fatalf("q%.2f = %v want %v", c.q, got, c.want)
		}
	}
	if !math.IsNaN(Quantile(nil, 0.5)) {
		t.Fatal("empty")
	}
}

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	recs := []Record{
		{ID: "a", Session: "s1", Worker: "w1", Arrival: 0, PromptTokens: 64, PromptBlocks: 4, CachedBlocks: 0, RouterBlocks: 0, OutputTokens: 10, TTFT: 100 * ms, ITL: 10 * ms, E2E: 200 * ms, Route: 50 * time.Microsecond},
		{ID: "b", Session: "s1", Worker: "w1", Arrival: 100 * ms, PromptTokens: 64, PromptBlocks: 4, CachedBlocks: 4, RouterBlocks: 4, OutputTokens: 10, TTFT: 20 * ms, ITL: 10 * ms, E2E: 120 * ms},
		{ID: "c", Session: "s1", Worker: "w2", Arrival: 200 * ms, PromptTokens: 64, PromptBlocks: 4, CachedBlocks: 2, RouterBlocks: 3, OutputTokens: 10, TTFT: 60 * ms, ITL: 10 * ms, E2E: 800 * ms},
		{ID: "d", Session: "s2", Outcome: Rejected, Code: "overloaded", Arrival: 300 * ms},
		{ID: "e", Outcome: Failed, Arrival: 400 * ms},
	}
	s := Summarize(recs, Options{Policy: "p", UpperBound: 0.75, BlockSize: 16, Workers: []string{"w1", "w2", "w10"}})
	if s.Requests != 5 || s.Done != 3 || s.Rejected != 1 || s.Failed != 1 || s.Codes["overloaded"] != 1 || s.Codes["failed"] != 1 {
		t.Fatalf("counts %+v", s)
	}
	if s.HitRatio != 0.5 || s.OfUpperBound != 0.5/0.75 || math.Abs(s.RouterHit-7.0/12) > 1e-12 {
		t.Fatalf("hit %v of %v router %v", s.HitRatio, s.OfUpperBound, s.RouterHit)
	}
	if s.TTFT.P50 != 60 || s.TTFT.Max != 100 || len(s.TTFTCDF) != CDFPoints || s.TTFTCDF[0] != 20 || s.TTFTCDF[100] != 100 {
		t.Fatalf("ttft %+v %v", s.TTFT, s.TTFTCDF)
	}
	if s.Route.N != 1 || s.Route.P50 != 0.05 {
		t.Fatalf("route %+v", s.Route)
	}
	if s.MakespanSeconds != 1.0 || s.RequestsPerSec != 3 {
		t.Fatalf("makespan %v rps %v", s.MakespanSeconds, s.RequestsPerSec)
	}
	if len(s.Workers) != 3 || s.Workers[0].Worker != "w1" || s.Workers[2].Worker != "w10" || s.Workers[0].Requests != 2 || s.Workers[0].PrefillTokens != 64 || s.Workers[1].PrefillTokens != 32 {
		t.Fatalf("workers %+v", s.Workers)
	}
	if math.Abs(s.RequestSpread.MaxOverMean-2) > 1e-12 || s.RequestSpread.CV <= 0 {
		t.Fatalf("spread %+v", s.RequestSpread)
	}
	if s.Sessions != 1 || s.SessionsMoved != 1 || s.SessionMoves != 1 {
		t.Fatalf("sessions %d moved %d moves %d", s.Sessions, s.SessionsMoved, s.SessionMoves)
	}
	if e := Summarize(nil, Options{}); e.HitRatio != 0 || e.TTFT.N != 0 {
		t.Fatalf("empty %+v", e)
	}
}

// PooledTTFT is the quantiles of every run's served requests together, as
// a naive sort of all of them gives, and the TTFTs stay out of reports.
func TestPooledTTFT(t *testing.T) {
	var sums []Summary
	var all []float64
	for run := range 3 {
		var recs []Record
		for i := range 50 + 20*run {
			ttft := float64((i*37+run*11)%97) + float64(run)*40 // runs of different sizes and levels
			recs = append(recs, Record{ID: fmt.Sprint(run, i), Worker: "w", Arrival: time.Duration(i) * time.Millisecond,
				PromptBlocks: 1, TTFT: time.Duration(ttft * float64(time.Millisecond)), E2E: time.Second})
			all = append(all, ttft)
		}
		recs = append(recs, Record{ID: "rejected", Outcome: Rejected, TTFT: time.Hour}) // not served: not pooled
		sums = append(sums, Summarize(recs, Options{}))
	}
	sort.Float64s(all)
	d := PooledTTFT(sums)
	if d.N != len(all) || d.P50 != Quantile(all, 0.5) || d.P99 != Quantile(all, 0.99) || d.Max != all[len(all)-1] {
		t.Fatalf("pooled %+v, want n %d p50 %v p99 %v max %v", d, len(all), Quantile(all, 0.5), Quantile(all, 0.99), all[len(all)-1])
	}
	if d.P99 == sums[1].TTFT.P99 {
		t.Fatal("the pooled p99 is one run's: the case does not tell them apart")
	}
	j, err := json.Marshal(sums[0])
	if err != nil || strings.Contains(string(j), "TTFTs") || strings.Contains(string(j), "ttfts") {
		t.Fatalf("summary JSON carries the TTFTs (%v): %.200s", err, j)
	}
	if e := PooledTTFT(nil); e.N != 0 {
		t.Fatalf("empty %+v", e)
	}
}

func TestRecorderConcurrent(t *testing.T) {
	r := NewRecorder(0)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				r.Add(Record{})
			}
		}()
	}
	wg.Wait()
	if r.Len() != 800 || len(r.Records()) != 800 {
		t.Fatal(r.Len())
	}
}

func TestNaturalLess(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{{"w2", "w10", true}, {"w10", "w2", false}, {"a", "b", true}, {"w01", "w1", false}, {"sim-3", "sim-03x", true}} {
		if naturalLess(c.a, c.b) != c.want {
			t.Fatalf("%q < %q", c.a, c.b)
		}
	}
}

// Load over time: two workers, one busy through the whole run and the
// other idle, is max/mean 2 at every sample; an even split is 1.
func TestLoadOverTime(t *testing.T) {
	var hot, even []Record
	for i := range 20 {
		a := time.Duration(i) * 10 * time.Millisecond
		hot = append(hot, Record{Worker: "a", Arrival: a, E2E: 50 * time.Millisecond, Finish: a + 50*time.Millisecond, TTFT: time.Millisecond})
		w := "a"
		if i%2 == 1 {
			w = "b"
		}
		even = append(even, Record{Worker: w, Arrival: a, E2E: 50 * time.Millisecond, Finish: a + 50*time.Millisecond, TTFT: time.Millisecond})
	}
	opt := Options{Workers: []string{"a", "b"}}
	for name, tc := range map[string]struct {
		recs []Record
		lo   float64
		hi   float64
	}{"hot": {hot, 2, 2}, "even": {even, 1, 1.5}} {
		s := Summarize(tc.recs, opt)
		if len(s.LoadOverTime) != LoadSamples {
			t.Fatalf("%s: %d samples", name, len(s.LoadOverTime))
		}
		for k, v := range s.LoadOverTime[10 : LoadSamples-10] { // ramps excluded: one request alone is max/mean 2
			if v < tc.lo || v > tc.hi {
				t.Errorf("%s: sample %d = %.2f, want in [%.1f, %.1f]", name, k+10, v, tc.lo, tc.hi)
			}
		}
	}
}
