package replay

import (
	"context"
	"fmt"
	"math"
	"slices"
)

// Calibration searches a workload's load levels (docs/benchmarks/replay.md,
// "Load levels"): for each target, the smallest load scale at which
// round-robin's TTFT p99 reaches that multiple of the unloaded TTFT p99.
// Every probe is a full replay of the workload with round-robin alone.
type Calibration struct {
	Targets []float64 // multiples of the unloaded p99; default LoadModerate, LoadHigh
	Start   float64   // first load scale probed; default 1
	MinLoad float64   // the search goes no lower; default 1/16
	MaxLoad float64   // nor higher; default 64
	// Bisect is the number of probes per target between the highest load
	// below it and the lowest at or above it (geometric midpoints);
	// default 3, which narrows a factor-2 bracket to 9 %.
	Bisect int
}

func (c *Calibration) defaults() {
	if len(c.Targets) == 0 {
		c.Targets = []float64{LoadModerate, LoadHigh}
	}
	c.Targets = slices.Sorted(slices.Values(c.Targets))
	if c.Start <= 0 {
		c.Start = 1
	}
	if c.MinLoad <= 0 {
		c.MinLoad = 1.0 / 16
	}
	if c.MaxLoad <= 0 {
		c.MaxLoad = 64
	}
	if c.Bisect <= 0 {
		c.Bisect = 3
	}
}

// LoadPoint is one probe: round-robin's TTFT p99 at a load scale, and its
// ratio to the unloaded p99.
type LoadPoint struct {
	Load  float64 `json:"load"`
	P99   float64 `json:"ttft_p99_ms"`
	Ratio float64 `json:"ratio"`
}

// LoadLevel is a target's result: the smallest probed load whose ratio
// reached it (Found false when none did up to MaxLoad).
type LoadLevel struct {
	Target float64 `json:"target"`
	Found  bool    `json:"found"`
	Load   float64 `json:"load"`
	Ratio  float64 `json:"ratio"`
}

// CalibrationResult is every probe, by load, and each target's level.
type CalibrationResult struct {
	UnloadedP99 float64     `json:"unloaded_ttft_p99_ms"`
	Points      []LoadPoint `json:"points"`
	Levels      []LoadLevel `json:"levels"`
}

// Calibrate finds cfg's workload's load levels by replaying it with
// round-robin at the loads searchLoads asks for (cfg.LoadScale and
// cfg.Policies are ignored; cfg.Runs > 1 probes each load with the median
// of that many runs).
func Calibrate(ctx context.Context, cfg Config, cal Calibration) (*CalibrationResult, error) {
	rr, err := LookupPolicies([]string{"round-robin"})
	if err != nil {
		return nil, err
	}
	cfg.Policies = rr
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	res := &CalibrationResult{}
	probe := func(load float64) (LoadPoint, error) {
		c := cfg
		c.LoadScale = load
		rep, err := Run(ctx, c)
		if err != nil {
			return LoadPoint{}, fmt.Errorf("replay: calibrate at load %g: %w", load, err)
		}
		p := rep.Policy("round-robin")
		if p == nil || rep.Unloaded == nil || rep.Unloaded.P99 <= 0 || p.Done == 0 {
			return LoadPoint{}, fmt.Errorf("%w: calibrate at load %g: round-robin served nothing", ErrConfig, load)
		}
		res.UnloadedP99 = rep.Unloaded.P99
		cfg.Logf("calibrate: load %.3g: round-robin TTFT p99 %.0f ms = %.1fx unloaded", load, p.TTFT.P99, p.TTFT.P99/rep.Unloaded.P99)
		return LoadPoint{Load: load, P99: p.TTFT.P99, Ratio: p.TTFT.P99 / rep.Unloaded.P99}, nil
	}
	pts, levels, err := searchLoads(probe, cal)
	res.Points, res.Levels = pts, levels
	return res, err
}

// searchLoads doubles the load from Start until the highest target is
// reached (halving first when Start is already past the lowest), then
// bisects each target's bracket, and reports the smallest probed load that
// reaches each target. It assumes the ratio grows with the load; noise
// only makes a level less precise.
func searchLoads(probe func(float64) (LoadPoint, error), cal Calibration) ([]LoadPoint, []LoadLevel, error) {
	cal.defaults()
	var pts []LoadPoint
	at := func(load float64) (LoadPoint, error) {
		p, err := probe(load)
		if err == nil {
			pts = append(pts, p)
		}
		return p, err
	}
	lowest, highest := cal.Targets[0], cal.Targets[len(cal.Targets)-1]
	p, err := at(cal.Start)
	for load := cal.Start; err == nil && p.Ratio >= lowest && load/2 >= cal.MinLoad; {
		load /= 2
		p, err = at(load)
	}
	top := slices.MaxFunc(pts, func(a, b LoadPoint) int { return cmpFloat(a.Load, b.Load) })
	for load, q := top.Load, top; err == nil && q.Ratio < highest && load*2 <= cal.MaxLoad; {
		load *= 2
		q, err = at(load)
	}
	for _, t := range cal.Targets {
		for step := 0; err == nil && step < cal.Bisect; step++ {
			lo, hi, ok := bracket(pts, t)
			if !ok || hi/lo < 1.02 {
				break
			}
			_, err = at(math.Sqrt(lo * hi))
		}
	}
	slices.SortFunc(pts, func(a, b LoadPoint) int { return cmpFloat(a.Load, b.Load) })
	levels := make([]LoadLevel, len(cal.Targets))
	for i, t := range cal.Targets {
		levels[i] = LoadLevel{Target: t}
		for _, q := range pts {
			if q.Ratio >= t {
				levels[i] = LoadLevel{Target: t, Found: true, Load: q.Load, Ratio: q.Ratio}
				break
			}
		}
	}
	return pts, levels, err
}

// bracket is the lowest probed load reaching target t and the highest
// probed load below it that does not.
func bracket(pts []LoadPoint, t float64) (lo, hi float64, ok bool) {
	hi = math.Inf(1)
	for _, q := range pts {
		if q.Ratio >= t && q.Load < hi {
			hi = q.Load
		}
	}
	for _, q := range pts {
		if q.Ratio < t && q.Load < hi && q.Load > lo {
			lo = q.Load
		}
	}
	return lo, hi, lo > 0 && !math.IsInf(hi, 1)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
