package report

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kvrouter/kvrouter/bench/metrics"
)

// The thresholds of the "why" section. A finding is written only when its
// figure crosses its threshold, so that what the section says stands out of
// the run-to-run noise and a policy with nothing notable gets one line of
// its main figures. Gaps are against the best policy over the same path.
const (
	// whyHitGap: a hit ratio this far below the path's best (0.02 = 2
	// points) is a cache-miss finding.
	whyHitGap = 0.02
	// whyIndexGap: the router-predicted and the engines' hit ratios this
	// far apart mean the router's index was wrong; closer, a cache-miss
	// finding is put on the choices instead.
	whyIndexGap = 0.03
	// whyMovedGap: a share of sessions served by more than one worker this
	// far above the path's lowest share is cache thrash.
	whyMovedGap = 0.05
	// whySpreadMax and whySpreadCV: the busiest worker's requests or
	// prefill tokens at or above this multiple of the mean, or a
	// coefficient of variation at or above this, are a hot spot.
	whySpreadMax = 1.25
	whySpreadCV  = 0.15
	// whyLoadHot and whyLoadHotShare: the busiest worker holding at least
	// whyLoadHot times the mean in-flight requests in at least this share
	// of the load-over-time samples is a hot spot. A share rather than the
	// peak, because every run ends with a few requests on one worker.
	whyLoadHot      = 2.0
	whyLoadHotShare = 0.2
	// whyQueueShare: the router's queue wait (wall clock times the
	// speed-up, as it enters TTFT) at or above this share of TTFT, at p50
	// or p99, is queueing in the router.
	whyQueueShare = 0.1
	// whyTTFTRatio: TTFT p50 or p99 at or above this multiple of the
	// path's best is queueing for the first token.
	whyTTFTRatio = 1.2
)

// trueCacheName is the policy that reads the engines' true caches on the
// client: no router can deploy it, so it is shown for comparison but is not
// the "best" the others are measured against.
const trueCacheName = "true-cache"

// finding is one line of a policy's "why".
type finding struct {
	rule string // the rule that wrote it
	text string
}

// peers is what one policy is compared with: the rows of its path.
type peers struct {
	rows    []*metrics.Summary // served something; true-cache only when alone
	truth   *metrics.Summary   // nil when true-cache did not run on the path
	speedup float64            // workload time per wall-clock second
}

// whyRule writes one finding about p when its figure crosses the rule's
// threshold.
type whyRule struct {
	name string
	find func(p *metrics.Summary, pe *peers) (string, bool)
}

// whyRules are the rules in the order their lines are written.
func whyRules() []whyRule {
	return []whyRule{
		{"rejections", findRejections},
		{"cache-misses", findCacheMisses},
		{"index", findIndex},
		{"cache-thrash", findThrash},
		{"hot-requests", findHotRequests},
		{"hot-prefill", findHotPrefill},
		{"hot-over-time", findHotOverTime},
		{"router-queue", findRouterQueue},
		{"ttft", findTTFT},
	}
}

// whySection writes "Why each policy wins or loses": per path, per policy,
// the findings its figures support.
func (r *Report) whySection(b *strings.Builder) {
	if len(r.Policies) == 0 {
		return
	}
	b.WriteString("\n## Why each policy wins or loses\n\n")
	fmt.Fprintf(b, "Written from the figures above: each line is a figure that crosses a threshold, "+
		"against the best policy over the same path (true-cache is shown, not counted as the best). "+
		"Thresholds: hit ratio %.0f pp below the best, router-predicted hit %.0f pp off the engines', sessions moved %.0f pp above the lowest, "+
		"load or prefill max/mean ≥ %.2f or CV ≥ %.2f, busiest worker ≥ %.0fx the mean in-flight in ≥ %.0f %% of the run, "+
		"router queue wait (times the speed-up) ≥ %.0f %% of TTFT, TTFT ≥ %.1fx the best.\n",
		100*whyHitGap, 100*whyIndexGap, 100*whyMovedGap, whySpreadMax, whySpreadCV, whyLoadHot, 100*whyLoadHotShare, 100*whyQueueShare, whyTTFTRatio)
	if slices.ContainsFunc(r.Policies, func(p metrics.Summary) bool { return p.Runs != nil }) {
		// bench/replay keeps the charts' data from one run (medianOfRuns).
		b.WriteString("Over several runs every figure here is the median of the runs, except load over time and rejections by code: " +
			"those are the run with the median TTFT p99.\n")
	}
	for _, path := range rowPaths(r.Policies) {
		pe := r.peersOn(path)
		if r.multiPath() {
			fmt.Fprintf(b, "\n### Over the %s path\n", path)
		}
		for i := range r.Policies {
			p := &r.Policies[i]
			if pathOf(p) != path {
				continue
			}
			fmt.Fprintf(b, "\n**%s**\n\n", p.Policy)
			for _, f := range whyFindings(p, pe) {
				fmt.Fprintf(b, "- %s\n", f.text)
			}
		}
	}
}

// defaultPath is the path of rows and reports written before they carried
// one: they ran over nats.
const defaultPath = "nats"

// pathOf is the row's path, defaultPath when it has none.
func pathOf(p *metrics.Summary) string {
	if p.Path == "" {
		return defaultPath
	}
	return p.Path
}

// rowPaths lists the rows' paths in the order they first appear.
func rowPaths(rows []metrics.Summary) []string {
	var out []string
	for i := range rows {
		if p := pathOf(&rows[i]); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// peersOn collects the rows of path the others are compared with.
func (r *Report) peersOn(path string) *peers {
	pe := &peers{speedup: r.Setup.Speedup}
	if pe.speedup <= 0 {
		pe.speedup = 1
	}
	for i := range r.Policies {
		p := &r.Policies[i]
		switch {
		case pathOf(p) != path || p.Done == 0:
		case p.Policy == trueCacheName:
			pe.truth = p
		default:
			pe.rows = append(pe.rows, p)
		}
	}
	if len(pe.rows) == 0 && pe.truth != nil {
		pe.rows = []*metrics.Summary{pe.truth}
	}
	return pe
}

// best is the row with the lowest figure (the highest with high); rows
// without the figure (NaN) do not count.
func (pe *peers) best(figure func(*metrics.Summary) float64, high bool) *metrics.Summary {
	var out *metrics.Summary
	for _, p := range pe.rows {
		if math.IsNaN(figure(p)) {
			continue
		}
		if out == nil || (high && figure(p) > figure(out)) || (!high && figure(p) < figure(out)) {
			out = p
		}
	}
	return out
}

// whyFindings applies every rule to p; with none crossing its threshold it
// says so with p's main figures.
func whyFindings(p *metrics.Summary, pe *peers) []finding {
	var out []finding
	if w := wins(p, pe); w != "" {
		out = append(out, finding{"wins", w})
	}
	for _, rule := range whyRules() {
		if p.Done == 0 && rule.name != "rejections" {
			continue // nothing was served: only the rejections say anything
		}
		if text, ok := rule.find(p, pe); ok {
			out = append(out, finding{rule.name, text})
		}
	}
	if len(out) == 0 || (len(out) == 1 && out[0].rule == "wins") {
		out = append(out, finding{"none", fmt.Sprintf("no loss stands out: hit ratio %.1f %% (%.0f %% of the bound), TTFT p50 %s ms, p99 %s ms, load max/mean %.2f%s",
			100*p.HitRatio, 100*p.OfUpperBound, num(p.TTFT.P50), num(p.TTFT.P99), p.RequestSpread.MaxOverMean, movedText(p))})
	}
	return out
}

// wins names the main figures on which p is at least as good as the best
// policy of its path.
func wins(p *metrics.Summary, pe *peers) string {
	if p.Done == 0 || len(pe.rows) < 2 {
		return ""
	}
	var on []string
	if b := pe.best(hitRatio, true); p.HitRatio >= b.HitRatio {
		on = append(on, fmt.Sprintf("hit ratio %.1f %%", 100*p.HitRatio))
	}
	if b := pe.best(ttftP50, false); p.TTFT.P50 <= b.TTFT.P50 {
		on = append(on, "TTFT p50 "+num(p.TTFT.P50)+" ms")
	}
	if b := pe.best(ttftP99, false); p.TTFT.P99 <= b.TTFT.P99 {
		on = append(on, "TTFT p99 "+num(p.TTFT.P99)+" ms")
	}
	if len(on) == 0 {
		return ""
	}
	if p.Policy == trueCacheName {
		return "ahead of every policy on " + strings.Join(on, ", ")
	}
	return "best of the path on " + strings.Join(on, ", ")
}

func hitRatio(p *metrics.Summary) float64 { return p.HitRatio }
func ttftP50(p *metrics.Summary) float64  { return p.TTFT.P50 }
func ttftP99(p *metrics.Summary) float64  { return p.TTFT.P99 }

// movedShare is the share of sessions served by more than one worker, NaN
// without sessions.
func movedShare(p *metrics.Summary) float64 {
	if p.Sessions == 0 {
		return math.NaN()
	}
	return float64(p.SessionsMoved) / float64(p.Sessions)
}

func movedText(p *metrics.Summary) string {
	if p.Sessions == 0 {
		return ""
	}
	return fmt.Sprintf(", %.1f %% of sessions moved", 100*movedShare(p))
}

// hotShare is the share of load-over-time samples (those with anything in
// flight) where the busiest worker held at least whyLoadHot x the mean, NaN
// without samples.
func hotShare(p *metrics.Summary) float64 {
	var busy, hot int
	for _, v := range p.LoadOverTime {
		if v <= 0 {
			continue
		}
		busy++
		if v >= whyLoadHot {
			hot++
		}
	}
	if busy == 0 {
		return math.NaN()
	}
	return float64(hot) / float64(busy)
}

// versus names the best row when it is another policy: "; best: P 1.00x".
func versus(p, best *metrics.Summary, figure func(*metrics.Summary) string) string {
	if best == nil || best == p {
		return ""
	}
	return "; best: " + best.Policy + " " + figure(best)
}

func findRejections(p *metrics.Summary, _ *peers) (string, bool) {
	if p.Rejected+p.Failed == 0 {
		return "", false
	}
	codes := make([]string, 0, len(p.Codes))
	for c := range p.Codes {
		codes = append(codes, c)
	}
	slices.SortFunc(codes, func(a, b string) int {
		return cmp.Or(cmp.Compare(p.Codes[b], p.Codes[a]), cmp.Compare(a, b))
	})
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%s %d", c, p.Codes[c])
	}
	text := fmt.Sprintf("rejections: %d rejected, %d failed of %d requests", p.Rejected, p.Failed, p.Requests)
	if len(parts) > 0 {
		text += " (" + strings.Join(parts, ", ") + ")"
	}
	return text, true
}

func findCacheMisses(p *metrics.Summary, pe *peers) (string, bool) {
	best := pe.best(hitRatio, true)
	if best == nil || best.HitRatio-p.HitRatio < whyHitGap {
		return "", false
	}
	text := fmt.Sprintf("cache misses: hit ratio %.1f %% = %.0f %% of the bound, %.1f pp below the best (%s %.1f %%)",
		100*p.HitRatio, 100*p.OfUpperBound, 100*(best.HitRatio-p.HitRatio), best.Policy, 100*best.HitRatio)
	if o := pe.truth; o != nil && o != p {
		text += fmt.Sprintf(", true-cache %.1f %%", 100*o.HitRatio)
	}
	if math.Abs(p.RouterHit-p.HitRatio) < whyIndexGap {
		text += fmt.Sprintf("; the router predicted %.1f %%, so the index was right and the loss is in the choices", 100*p.RouterHit)
	}
	return text, true
}

func findIndex(p *metrics.Summary, _ *peers) (string, bool) {
	gap := p.RouterHit - p.HitRatio
	switch {
	case gap >= whyIndexGap:
		return fmt.Sprintf("cache misses, the index was wrong: the router predicted %.1f %% hit, the engines found %.1f %% (%.1f pp less)",
			100*p.RouterHit, 100*p.HitRatio, 100*gap), true
	case -gap >= whyIndexGap:
		return fmt.Sprintf("the index missed cached blocks: the router predicted %.1f %% hit, the engines found %.1f %% (%.1f pp more)",
			100*p.RouterHit, 100*p.HitRatio, -100*gap), true
	}
	return "", false
}

func findThrash(p *metrics.Summary, pe *peers) (string, bool) {
	if p.Sessions == 0 {
		return "", false
	}
	best := pe.best(movedShare, false)
	if best == nil || movedShare(p)-movedShare(best) < whyMovedGap {
		return "", false
	}
	return fmt.Sprintf("cache thrash: %d of %d sessions (%.1f %%) were served by more than one worker, against %.1f %% for %s",
		p.SessionsMoved, p.Sessions, 100*movedShare(p), 100*movedShare(best), best.Policy), true
}

func findHotRequests(p *metrics.Summary, pe *peers) (string, bool) {
	return findHotSpread(p, pe, "served %.2fx the mean requests", func(q *metrics.Summary) metrics.Spread { return q.RequestSpread })
}

func findHotPrefill(p *metrics.Summary, pe *peers) (string, bool) {
	return findHotSpread(p, pe, "computed %.2fx the mean prefill tokens", func(q *metrics.Summary) metrics.Spread { return q.PrefillSpread })
}

// findHotSpread is a hot spot when the busiest worker's share of what
// spread measures crosses whySpreadMax or its CV whySpreadCV; busiest
// formats the max over mean.
func findHotSpread(p *metrics.Summary, pe *peers, busiest string, spread func(*metrics.Summary) metrics.Spread) (string, bool) {
	s := spread(p)
	if s.MaxOverMean < whySpreadMax && s.CV < whySpreadCV {
		return "", false
	}
	best := pe.best(func(q *metrics.Summary) float64 { return spread(q).CV }, false)
	return fmt.Sprintf("hot spots: the busiest worker "+busiest+" (CV %.2f)%s", s.MaxOverMean, s.CV,
		versus(p, best, func(b *metrics.Summary) string {
			return fmt.Sprintf("%.2fx, CV %.2f", spread(b).MaxOverMean, spread(b).CV)
		})), true
}

func findHotOverTime(p *metrics.Summary, pe *peers) (string, bool) {
	share := hotShare(p)
	if !(share >= whyLoadHotShare) { // NaN without samples
		return "", false
	}
	best := pe.best(hotShare, false)
	return fmt.Sprintf("hot spots: the busiest worker held ≥ %.0fx the mean in-flight requests in %.0f %% of the run (peak %.1fx)%s",
		whyLoadHot, 100*share, slices.Max(p.LoadOverTime), versus(p, best, func(b *metrics.Summary) string {
			return fmt.Sprintf("%.0f %%", 100*hotShare(b))
		})), true
}

func findRouterQueue(p *metrics.Summary, pe *peers) (string, bool) {
	q := p.Queue
	if q.N == 0 {
		return "", false
	}
	at50, at99 := share(pe.speedup*q.P50, p.TTFT.P50), share(pe.speedup*q.P99, p.TTFT.P99)
	if at50 < whyQueueShare && at99 < whyQueueShare {
		return "", false
	}
	// The figures in workload time beside TTFT, which a reader compares
	// more readily than a ratio.
	return fmt.Sprintf("queueing in the router: queue wait p50 %s ms, p99 %s ms wall clock = %s / %s ms at the x%g speed-up, against TTFT p50 %s ms, p99 %s ms",
		num(q.P50), num(q.P99), num(pe.speedup*q.P50), num(pe.speedup*q.P99), pe.speedup, num(p.TTFT.P50), num(p.TTFT.P99)), true
}

func findTTFT(p *metrics.Summary, pe *peers) (string, bool) {
	var parts []string
	for _, q := range []struct {
		name   string
		figure func(*metrics.Summary) float64
	}{{"p50", ttftP50}, {"p99", ttftP99}} {
		best := pe.best(q.figure, false)
		if best == nil || best == p || share(q.figure(p), q.figure(best)) < whyTTFTRatio {
			continue
		}
		part := fmt.Sprintf("%s %s ms = %.1fx the best (%s %s ms", q.name, num(q.figure(p)), share(q.figure(p), q.figure(best)), best.Policy, num(q.figure(best)))
		if o := pe.truth; o != nil && o != p {
			part += ", true-cache " + num(q.figure(o)) + " ms"
		}
		parts = append(parts, part+")")
	}
	if len(parts) == 0 {
		return "", false
	}
	return "queueing for the first token: TTFT " + strings.Join(parts, ", "), true
}

// share is a / b, 0 when b is not positive.
func share(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}
