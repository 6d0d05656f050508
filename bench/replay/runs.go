package replay

import (
	"math"
	"slices"

	"github.com/kvrouter/kvrouter/bench/metrics"
)

// medianOfRuns folds one (policy, path)'s summaries from repeated runs into
// one: every figure the tables show (hit ratio, TTFT, E2E and ITL
// quantiles, throughput, request and prefill spread, router queue wait and
// route time p50/p99, sessions moved, a split's hit per side, transfer
// and prefill leg) is the median over the runs, with the
// lowest and highest of the main ones and the TTFT of every run's requests
// pooled in Runs; what only the charts and the
// counts show (CDF, per-worker load, load over time, rejections by code) is
// the run whose TTFT p99 is the median, so the charts show a real run. The
// lowest cached-share estimate is the lowest of the runs'.
func medianOfRuns(sums []metrics.Summary) metrics.Summary {
	if len(sums) == 1 {
		return sums[0]
	}
	byP99 := slices.Clone(sums)
	slices.SortFunc(byP99, func(a, b metrics.Summary) int {
		switch {
		case a.TTFT.P99 < b.TTFT.P99:
			return -1
		case a.TTFT.P99 > b.TTFT.P99:
			return 1
		}
		return 0
	})
	out := byP99[len(byP99)/2]
	med := func(get func(*metrics.Summary) float64) (float64, [2]float64) {
		v := make([]float64, len(sums))
		for i := range sums {
			v[i] = get(&sums[i])
		}
		slices.Sort(v)
		m := v[len(v)/2]
		if len(v)%2 == 0 {
			m = (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		return m, [2]float64{v[0], v[len(v)-1]}
	}
	sp := &metrics.RunSpread{N: len(sums), PooledTTFT: metrics.PooledTTFT(sums)}
	out.HitRatio, sp.HitRatio = med(func(s *metrics.Summary) float64 { return s.HitRatio })
	out.TTFT.P50, sp.TTFTP50 = med(func(s *metrics.Summary) float64 { return s.TTFT.P50 })
	out.TTFT.P99, sp.TTFTP99 = med(func(s *metrics.Summary) float64 { return s.TTFT.P99 })
	out.E2E.P50, sp.E2EP50 = med(func(s *metrics.Summary) float64 { return s.E2E.P50 })
	out.TTFT.P90, _ = med(func(s *metrics.Summary) float64 { return s.TTFT.P90 })
	out.TTFT.Mean, _ = med(func(s *metrics.Summary) float64 { return s.TTFT.Mean })
	out.E2E.P99, _ = med(func(s *metrics.Summary) float64 { return s.E2E.P99 })
	out.ITL.P50, _ = med(func(s *metrics.Summary) float64 { return s.ITL.P50 })
	out.RouterHit, _ = med(func(s *metrics.Summary) float64 { return s.RouterHit })
	out.RequestsPerSec, _ = med(func(s *metrics.Summary) float64 { return s.RequestsPerSec })
	out.OutputTokPerSec, _ = med(func(s *metrics.Summary) float64 { return s.OutputTokPerSec })
	out.RequestSpread.MaxOverMean, _ = med(func(s *metrics.Summary) float64 { return s.RequestSpread.MaxOverMean })
	out.RequestSpread.CV, _ = med(func(s *metrics.Summary) float64 { return s.RequestSpread.CV })
	out.PrefillSpread.MaxOverMean, _ = med(func(s *metrics.Summary) float64 { return s.PrefillSpread.MaxOverMean })
	out.PrefillSpread.CV, _ = med(func(s *metrics.Summary) float64 { return s.PrefillSpread.CV })
	out.Queue.P50, _ = med(func(s *metrics.Summary) float64 { return s.Queue.P50 })
	out.Queue.P99, _ = med(func(s *metrics.Summary) float64 { return s.Queue.P99 })
	out.Route.P50, _ = med(func(s *metrics.Summary) float64 { return s.Route.P50 })
	out.Route.P99, _ = med(func(s *metrics.Summary) float64 { return s.Route.P99 })
	out.ITL.P99, _ = med(func(s *metrics.Summary) float64 { return s.ITL.P99 })
	if out.PD != nil {
		pd := *out.PD
		pdMed := func(get func(*metrics.PDSummary) float64) float64 {
			v, _ := med(func(s *metrics.Summary) float64 { return get(s.PD) })
			return v
		}
		pd.PrefillHit = pdMed(func(p *metrics.PDSummary) float64 { return p.PrefillHit })
		pd.DecodeHit = pdMed(func(p *metrics.PDSummary) float64 { return p.DecodeHit })
		pd.TransferBlocks = pdMed(func(p *metrics.PDSummary) float64 { return p.TransferBlocks })
		pd.Transfer.P50 = pdMed(func(p *metrics.PDSummary) float64 { return p.Transfer.P50 })
		pd.Transfer.P99 = pdMed(func(p *metrics.PDSummary) float64 { return p.Transfer.P99 })
		pd.PrefillLeg.P50 = pdMed(func(p *metrics.PDSummary) float64 { return p.PrefillLeg.P50 })
		pd.PrefillLeg.P99 = pdMed(func(p *metrics.PDSummary) float64 { return p.PrefillLeg.P99 })
		out.PD = &pd
	}
	moved, _ := med(func(s *metrics.Summary) float64 { return float64(s.SessionsMoved) })
	out.SessionsMoved = int(math.Round(moved))
	if out.UpperBound > 0 {
		out.OfUpperBound = out.HitRatio / out.UpperBound
	}
	out.CachedShareLow = nil
	for _, s := range sums {
		if s.CachedShareLow != nil && (out.CachedShareLow == nil || *s.CachedShareLow < *out.CachedShareLow) {
			out.CachedShareLow = s.CachedShareLow
		}
	}
	out.Runs = sp
	out.Diagnostics = nil
	for _, s := range sums {
		out.Diagnostics = append(out.Diagnostics, s.Diagnostics...)
	}
	return out
}
