package scheduler

// cachedShare is a scheduler's running estimate of how much of the prompts
// it routes the chosen worker already holds: an exponentially weighted
// average of overlap blocks over prompt blocks, each selection weighted by
// its prompt blocks (so it reads like the fleet's hit ratio), forgetting
// with a time constant of about cachedShareSpan selections. The scheduler
// notes every selection of a whole request or prefill leg (runPolicy) and
// hands the value to policies as Context.CachedShare; it is 1 until a
// selection with prompt blocks has been noted.
//
// Why a policy wants it: the default cost's decode-block term is the one
// load signal that spreads requests whose prompts are mostly cached (their
// prefill queues stay near empty), and it only moves sessions away from
// their caches where long uncached prompts already spread the load through
// the prefill queues (docs/benchmarks.md, "Issue 24 at stop 50").
// CostParams.DecodeFullShare makes that term follow this share.
//
// Owned by the core and used under its lock only.
type cachedShare struct {
	cached, prompt float64 // decayed sums of overlap and prompt blocks
}

// cachedShareSpan is the estimate's time constant in selections: at tens
// to hundreds of routes a second, seconds of history, long enough to
// average out single requests and short enough to follow a change of
// workload.
const cachedShareSpan = 256

// note adds one selection: overlap of the chosen worker's blocks out of
// prompt blocks. A selection without full prompt blocks says nothing.
func (s *cachedShare) note(overlap, prompt int) {
	if prompt <= 0 {
		return
	}
	const keep = 1 - 1.0/cachedShareSpan
	s.cached = s.cached*keep + float64(min(max(overlap, 0), prompt))
	s.prompt = s.prompt*keep + float64(prompt)
}

// value is the estimate in [0, 1], 1 before anything was noted.
func (s *cachedShare) value() float64 {
	if s.prompt <= 0 {
		return 1
	}
	return s.cached / s.prompt
}
