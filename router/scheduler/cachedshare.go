package scheduler

// cachedShare is a scheduler's running estimate of how much of the prompts
// it routes the chosen worker already holds: an exponentially weighted
// average of overlap blocks over prompt blocks, each selection weighted by
// its prompt blocks (so it reads like the fleet's hit ratio), forgetting
// with a time constant of about cachedShareSpan selections. The scheduler
// notes every selection of a whole request or prefill leg (runPolicy) and
// hands the value to policies as Context.CachedShare.
//
// It starts from a prior: as if cachedSharePrior selections of the mean
// prompt seen so far had been fully cached, a mass that fades at the same
// rate as the evidence. So it is 1 before the first selection and moves
// away from 1 only as evidence accumulates. Why: every run and every
// restart begins cold, its first prompts uncached because nothing is yet;
// without the prior the estimate read 0 right after the first uncached
// selection and a policy that follows it behaved as on a workload with no
// reuse until enough history came in (docs/benchmarks.md, "Issue 24 at
// stop 50", round 2).
//
// Why a policy wants it: the default cost's decode-block term is the one
// load signal that spreads requests whose prompts are mostly cached (their
// prefill queues stay near empty), and it only moves sessions away from
// their caches where long uncached prompts already spread the load through
// the prefill queues. CostParams.DecodeFullShare makes that term follow
// this share.
//
// Owned by the core and used under its lock only. The zero value is an
// estimate with nothing noted.
type cachedShare struct {
	cached, prompt float64 // decayed sums of overlap and prompt blocks
	faded          float64 // 1 - shareKeep^n after n selections: the prior's lost share
}

const (
	// cachedShareSpan is the estimate's time constant in selections: at
	// tens to hundreds of routes a second, seconds of history, long enough
	// to average out single requests and short enough to follow a change
	// of workload.
	cachedShareSpan = 256
	// cachedSharePrior is the prior's mass in selections, a quarter of the
	// span: a workload with a fifth of its prompts cached brings the
	// estimate down to one half in about 90 selections, one with most of
	// them cached never takes it there during its cold start.
	cachedSharePrior = cachedShareSpan / 4
	// shareKeep is what each selection keeps of the earlier ones, in this
	// estimate and in heldShare: a time constant of cachedShareSpan.
	shareKeep = 1 - 1.0/cachedShareSpan
)

// note adds one selection: overlap of the chosen worker's blocks out of
// prompt blocks. A selection without full prompt blocks says nothing.
func (s *cachedShare) note(overlap, prompt int) {
	if prompt <= 0 {
		return
	}
	s.cached = s.cached*shareKeep + float64(min(max(overlap, 0), prompt))
	s.prompt = s.prompt*shareKeep + float64(prompt)
	s.faded = 1 - (1-s.faded)*shareKeep
}

// value is the estimate in [0, 1], 1 before anything was noted. With r the
// evidence's ratio and the evidence's decayed selection count
// faded·span, the prior's remaining mass relative to it is
// w = prior·(1−faded) / (faded·span), and the estimate (r + w) / (1 + w):
// the ratio of the sums had they been preloaded with prior fully cached
// selections of the mean prompt.
func (s *cachedShare) value() float64 {
	if s.prompt <= 0 || s.faded <= 0 {
		return 1
	}
	r := s.cached / s.prompt
	w := cachedSharePrior * (1 - s.faded) / (s.faded * cachedShareSpan)
	return (r + w) / (1 + w)
}

// heldShare is a scheduler's running share of its recent selections whose
// request waited in its admission queue first: an exponentially weighted
// average over about cachedShareSpan selections, 0 before the first. It
// is the replica's own sign that every worker it could use was busy
// lately, which the least-loaded worker's queue does not give while one
// worker is still short of it. CostParams.DecodeShareUntilHeld makes the
// cached share's reduction of the decode-block term end with it
// (docs/benchmarks.md, "Issue 24 at stop 52": at the trace's load 5 no
// request waited, at 7.5 some did, and there the reduction lost).
//
// Owned by the core and used under its lock only.
type heldShare struct{ v float64 }

// note adds one selection, held when its request had waited.
func (s *heldShare) note(held bool) {
	s.v *= shareKeep
	if held {
		s.v += 1 - shareKeep
	}
}
