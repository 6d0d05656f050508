package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/workerref"
)

// The design note's matrix: ISL 2,048 tokens, block size 16, worker i has
// (i % 32)·64 cached tokens, i·16 active prefill tokens, i % 127 decode
// blocks and i % 17 active requests.
const benchISL = 2048

// keyMode says how the overlap keys' worker-name strings relate to the
// ones the scheduler saw before.
type keyMode int

const (
	keysStable      keyMode = iota // the same strings every time (the index stores each name once)
	keysAlternating                // two copies used in turn: positional hints miss, the hash cache hits
	keysUncached                   // caches invalidated before each selection: every key goes through the map
)

func benchCore(b testing.TB, n int, p Policy) (*core, *waiter, [2][]Overlap) {
	s, err := New(Config{Seed: 1, HasSeed: true, Thresholds: Thresholds{}, ThresholdsSet: true}, p)
	if err != nil {
		b.Fatal(err)
	}
	c := s.c
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("worker-%05d", i)
		c.upsertWorker(WorkerInfo{Key: wk(names[i], 0), Available: true})
	}
	fl := c.fl
	for i := range n {
		sl := fl.lookup(names[i], 0)
		fl.lPrefill[sl] = int64(i * 16)
		fl.lDecode[sl] = int64(i % 127)
		fl.lActive[sl] = int32(i % 17)
		fl.refresh(sl, &c.th)
	}
	r := &Request{ID: "bench", Tokens: benchISL, SeqHashes: hashes(benchISL/16, 1)}
	var sets [2][]Overlap
	for k := range sets {
		for i := range n {
			if cached := (i % 32) * 64; cached > 0 {
				name := names[i]
				if k == 1 {
					name = strings.Clone(name) // same name, other memory
				}
				sets[k] = append(sets[k], Overlap{Key: wk(name, 0), Blocks: cached / 16})
			}
		}
	}
	r.Overlaps = sets[0]
	w := &waiter{req: r, dlIndex: -1}
	plan, err := applyPinRule(r, nil)
	if err != nil {
		b.Fatal(err)
	}
	w.plan = plan
	return c, w, sets
}

func benchSelect(b *testing.B, n int, p Policy, keys keyMode) {
	c, w, sets := benchCore(b, n, p)
	if _, _, _, err := c.selectWorker(w); err != nil { // warm the scratch
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu := startCPU()
	k := 0
	for b.Loop() {
		switch keys {
		case keysAlternating:
			k ^= 1
			w.req.Overlaps = sets[k]
		case keysUncached:
			c.fl.resizeCache(n)
			c.fl.hints = c.fl.hints[:0]
		}
		if _, _, _, err := c.selectWorker(w); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// BenchmarkDefaultSelection is one selection by the default policy: overlap
// resolution, shared-block lookup, eligibility, the pin rule, cost and pick.
func BenchmarkDefaultSelection(b *testing.B) {
	for _, temp := range []float64{0, 0.7} {
		for _, n := range []int{2, 32, 1024, 2048, 10000} {
			b.Run(fmt.Sprintf("T=%v/workers=%d", temp, n), func(b *testing.B) {
				benchSelect(b, n, NewDefaultPolicy(temp), keysStable)
			})
		}
	}
}

// BenchmarkKeyResolution: the default selection at T=0 when the overlap
// keys are not the strings seen last time (see keyMode).
func BenchmarkKeyResolution(b *testing.B) {
	for _, km := range []struct {
		name string
		mode keyMode
	}{{"alternating", keysAlternating}, {"uncached", keysUncached}} {
		for _, n := range []int{32, 2048, 10000} {
			b.Run(fmt.Sprintf("%s/workers=%d", km.name, n), func(b *testing.B) {
				benchSelect(b, n, NewDefaultPolicy(0), km.mode)
			})
		}
	}
}

// customScorer is what a user-written scorer looks like: accessor calls only.
type customScorer struct{}

func (customScorer) Score(x *Context, c *Candidates, cost []float64) {
	inv := 1 / float64(x.BlockSize)
	for i := range c.Len() {
		cost[i] = float64(c.ActivePrefillTokens(i)+x.PromptTokens)*inv -
			float64(c.OverlapBlocks(i)) + float64(c.PotentialDecodeBlocks(i))
	}
}

// keepAll is a filter that looks at every candidate and keeps it.
type keepAll struct{}

func (keepAll) Filter(_ *Context, c *Candidates, keep []bool) {
	for i := range c.Len() {
		keep[i] = c.ActiveRequests(i) >= 0
	}
}

func BenchmarkCustomSelection(b *testing.B) {
	for _, tc := range []struct {
		name    string
		filters []Filter
	}{
		{"no_filter", nil},
		{"keep_all_filter", []Filter{keepAll{}}},
	} {
		b.Run(fmt.Sprintf("%s/workers=10000", tc.name), func(b *testing.B) {
			p := &Pipeline{PolicyName: "custom", Filters: tc.filters,
				Scorers: []WeightedScorer{{Scorer: customScorer{}, Weight: 1}}, Picker: MinPicker{}}
			benchSelect(b, 10000, p, keysStable)
		})
	}
}

// BenchmarkSelectionUnderHard: the pin rule narrows to one worker.
func BenchmarkSelectionUnderHard(b *testing.B) {
	c, w, _ := benchCore(b, 2048, NewDefaultPolicy(0))
	w.req.Affinity = hardTo(workerref.Any("worker-00100"))
	w.plan, _ = applyPinRule(w.req, nil)
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		if s, _, _, err := c.selectWorker(w); err != nil || c.fl.key[s].Worker != "worker-00100" {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// startBenchScheduler starts a default-policy scheduler without queue
// thresholds over n available workers, closed at the benchmark's end.
func startBenchScheduler(b *testing.B, n int) *Scheduler {
	s, err := New(Config{Seed: 1, HasSeed: true, Thresholds: Thresholds{}, ThresholdsSet: true}, NewDefaultPolicy(0))
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		if err := s.UpsertWorker(WorkerInfo{Key: wk(fmt.Sprintf("worker-%05d", i), 0), Available: true}); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkSchedule is a full Schedule call (validation, the scheduler's
// lock, admission, selection, booking of 128 prompt blocks) followed by
// Free.
func BenchmarkSchedule(b *testing.B) {
	for _, n := range []int{32, 2048} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			s := startBenchScheduler(b, n)
			r := &Request{ID: "r", Tokens: benchISL, ExpectedOutput: 128, SeqHashes: hashes(benchISL/16, 1)}
			for i := 0; i < n; i += 3 {
				r.Overlaps = append(r.Overlaps, Overlap{Key: wk(fmt.Sprintf("worker-%05d", i), 0), Blocks: (i % 32) * 4})
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				d, err := s.Schedule(ctx, r)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Free(d.Fence); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScheduleLoaded is BenchmarkSchedule at 32 workers with many
// requests in flight, as on a busy fleet: each op schedules a request of
// 128 prompt blocks and frees the one scheduled `inflight` ops earlier,
// so the booked-blocks table holds about inflight x 128 hashes (at 4,096,
// half a million: larger than the CPU's caches). The prompts are fresh,
// or (shared=64) open with one of 16 shared 64-block prefixes, whose
// holders every selection walks.
func BenchmarkScheduleLoaded(b *testing.B) {
	for _, c := range []struct{ inflight, shared int }{{256, 0}, {4096, 0}, {4096, 64}} {
		inflight := c.inflight
		name := fmt.Sprintf("inflight=%d", inflight)
		if c.shared > 0 {
			name += fmt.Sprintf("/shared=%d", c.shared)
		}
		b.Run(name, func(b *testing.B) {
			s := startBenchScheduler(b, 32)
			reqs := make([]Request, 2*inflight)
			for i := range reqs {
				reqs[i] = Request{ID: fmt.Sprintf("r%d", i), Tokens: benchISL, ExpectedOutput: 128,
					SeqHashes: hashes(benchISL/16, uint64(i+1)*0x9e3779b1)}
				copy(reqs[i].SeqHashes, hashes(c.shared, uint64(i%16+1)))
			}
			ring := make([]Fence, inflight)
			ctx := context.Background()
			for i := range inflight {
				d, err := s.Schedule(ctx, &reqs[i])
				if err != nil {
					b.Fatal(err)
				}
				ring[i] = d.Fence
			}
			b.ReportAllocs()
			i := inflight
			for b.Loop() {
				if err := s.Free(ring[i%inflight]); err != nil {
					b.Fatal(err)
				}
				d, err := s.Schedule(ctx, &reqs[i%len(reqs)])
				if err != nil {
					b.Fatal(err)
				}
				ring[i%inflight] = d.Fence
				i++
			}
		})
	}
}

// cpuMeter reports thread CPU ns/op next to wall ns/op (see threadCPU).
type cpuMeter struct{ start int64 }

func startCPU() cpuMeter {
	lockThread()
	return cpuMeter{start: threadCPU()}
}

func (m cpuMeter) report(b *testing.B) {
	end := threadCPU()
	unlockThread()
	if m.start > 0 && b.N > 0 {
		b.ReportMetric(float64(end-m.start)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkCalibration is a bare cost-and-min loop over 10,000 rows held in
// plain arrays: the machine's floor for a 10,000-worker selection.
func BenchmarkCalibration(b *testing.B) {
	n := 10000
	p := make([]int64, n)
	d := make([]int64, n)
	ov := make([]int32, n)
	sl := make([]int32, n)
	for i := range n {
		p[i], d[i], ov[i], sl[i] = int64(i*16), int64(i%127), int32(i%32*4), int32(i)
	}
	var sink int
	cpu := startCPU()
	for b.Loop() {
		best, bi := 1e300, 0
		for i, s := range sl {
			pre := max(0, (float64(p[s])+2048)*0.0625-float64(ov[i]))
			if c := pre + float64(d[s]+128); c < best {
				best, bi = c, i
			}
		}
		sink += bi
	}
	cpu.report(b)
	_ = sink
}
