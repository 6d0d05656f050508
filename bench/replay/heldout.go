package replay

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kvrouter/kvrouter/bench/workload"
)

// ErrInSample reports a policy configuration asked to run on an evaluation
// part it was tuned on, without Config.AllowInSample.
var ErrInSample = errors.New("replay: in-sample evaluation refused")

// Tuning is one workload a policy configuration was tuned on: what was
// chosen by looking at its figures there.
type Tuning struct {
	// Workload is the whole workload's name, as reports give it
	// ("mooncake:conversation", "synthetic:rag").
	Workload string
	// Part is the part the tuning ran on (workload.PartTune, the rule).
	Part workload.Part
	// Head > 0 stands for a tuning from before the held-out split: on the
	// whole workload's first Head requests. It touches every part that
	// holds any of them.
	Head int
	// Note says what was chosen there and where it is written down.
	Note string
}

// String says where on its workload the tuning ran and what it chose.
func (t Tuning) String() string {
	where := "its " + string(t.Part) + " part"
	if t.Head > 0 {
		where = fmt.Sprintf("its first %d requests", t.Head)
	}
	return fmt.Sprintf("%s: %s", where, t.Note)
}

// touches reports whether the tuning saw any request of part p.
func (t Tuning) touches(p *workload.PartInfo) bool {
	switch {
	case t.Workload != p.Workload:
		return false
	case t.Head > 0:
		return p.HoldsAnyOf(t.Head)
	}
	return t.Part == p.Part
}

// stop45Tuning is the record of the default of stops 45-52. Its router
// queue threshold (8) was chosen on the head of the two Mooncake traces,
// before the held-out split (docs/benchmarks.md, "Issue 17"): the
// conversation trace's head lies in its tuning part; the synthetic trace's
// first 2,000 requests reach 75 requests into its evaluation part. Its cost
// weights (overlap credit 1.25 rising to 3 with the load, decode-block
// weight 0.25, no output blocks) were chosen on the tuning parts of four
// generated workloads and the conversation trace's head ("Issue 24").
var stop45Tuning = []Tuning{
	{Workload: "mooncake:conversation", Head: 2000, Note: queueTuningNote + "; " + weightsTuningNote},
	{Workload: "mooncake:synthetic", Head: 2000, Note: queueTuningNote},
	{Workload: "synthetic:agent-loop", Part: workload.PartTune, Note: weightsTuningNote},
	{Workload: "synthetic:rag", Part: workload.PartTune, Note: weightsTuningNote},
	{Workload: "synthetic:burst", Part: workload.PartTune, Note: weightsTuningNote},
	{Workload: "synthetic:tenant-chat", Part: workload.PartTune, Note: weightsTuningNote},
}

// defaultTuning is the record of the default's configuration: stop 45's,
// and its decode-block weight following the cached share until the
// admission queue engages, chosen on the conversation trace's tuning part.
var defaultTuning = append(slices.Clip(stop45Tuning),
	Tuning{Workload: "mooncake:conversation", Part: workload.PartTune, Note: decodeShareTuningNote})

const (
	localPrefillTuningNote = "the local prefill rule of split fleets kept on the trace's tuning part at load 9, one run " +
		"against kvrouter-pd without it (docs/pd.md)"
	queueTuningNote = "the router queue threshold 8 swept on the first 1,000 requests and confirmed on the first 2,000 " +
		"(docs/benchmarks.md, Issue 17)"
	weightsTuningNote = "the default cost's weights (overlap credit 1.25, decode-block weight 0.25, no output blocks) " +
		"chosen among nine on the tuning parts at speed-up 1 (the trace at 3), 2-4 runs each, by the lowest worst ratio " +
		"to the best peer (docs/benchmarks.md, Issue 24: the default's weights swept again at speed-up 1); the earlier " +
		"1.5 / 0.5 at speed-up 10 and 3; the load-following credit (rising to 3 at 32,768 tokens queued on the " +
		"least-loaded worker) chosen among four the same way at stop 37 (Issue 24: a credit that follows the load); " +
		"the sole-holder credit 1 with the prefill step of 1,024 tokens passed two rounds on six fresh tuning samples at " +
		"stop 44 (Issue 24: a lower credit for a prefix one worker holds)"
	decodeShareTuningNote = "the decode-block weight following the cached share (whole from 0.5) until 0.4 % of " +
		"recent selections waited in the admission queue, chosen in round 8 of three candidates against the previous " +
		"default, at loads 5 and 7.5 on both paths, medians of six runs (docs/benchmarks.md, Issue 24 at stop 52)"
)

// TunedOn records, per catalog entry, the workloads its configuration was
// tuned on. An entry not listed was tuned on none: the baselines, the peers
// as their authors ship them, and the default-cost experiments that lost.
// Every entry that runs the default cost at its default weights carries the
// default's record (catalog_test checks it).
var TunedOn = map[string][]Tuning{
	"kvrouter":        defaultTuning,
	"kvrouter-approx": defaultTuning,
	// The default cost on the prefill leg; the replica's local prefill rule
	// was kept on the trace's tuning part and the agent loop's.
	"kvrouter-pd": append(slices.Clip(defaultTuning),
		Tuning{Workload: "mooncake:conversation", Part: workload.PartTune, Note: localPrefillTuningNote}),
	"true-cache":      defaultTuning,
	"kvrouter-stop45": stop45Tuning,
}

// inSample is what each policy was tuned on within part p: the policies
// whose figures on p are not held out.
func inSample(pols []Policy, p *workload.PartInfo) map[string][]Tuning {
	out := map[string][]Tuning{}
	if p == nil {
		return out
	}
	for _, pol := range pols {
		// A parameterised variant ("kvrouter{overlap_credit=2}") carries
		// its base entry's record: its weights are one more point of the
		// same search.
		base, _, _ := strings.Cut(pol.Name, "{")
		for _, t := range TunedOn[base] {
			if t.touches(p) {
				out[pol.Name] = append(out[pol.Name], t)
			}
		}
	}
	return out
}

// checkHeldOut enforces the held-out protocol: on an evaluation part, a
// policy tuned on it runs only with AllowInSample, and its rows are then
// marked in-sample. On a tuning part every figure is a tuning figure.
func (c *Config) checkHeldOut() error {
	c.inSample = nil
	if c.Part == nil || c.Part.Part != workload.PartEval {
		return nil
	}
	c.inSample = inSample(c.Policies, c.Part)
	if len(c.inSample) == 0 || c.AllowInSample {
		return nil
	}
	return fmt.Errorf("%w: %s (--allow-in-sample runs them, labelled IN-SAMPLE)", ErrInSample, inSampleText(c.inSample, c.Part))
}

// inSampleText names each in-sample policy and what it was tuned on.
func inSampleText(m map[string][]Tuning, p *workload.PartInfo) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		var ts []string
		for _, t := range m[n] {
			ts = append(ts, t.String())
		}
		parts = append(parts, fmt.Sprintf("%s was tuned on requests of this %s part of %s (%s)", n, p.Part, p.Workload, strings.Join(ts, "; ")))
	}
	return strings.Join(parts, "; ")
}

// partNote is the report's statement of the held-out rule for this run.
func (c *Config) partNote() string {
	p := c.Part
	switch {
	case p == nil:
		return "Held-out protocol: this workload was not a declared part (no tuning/evaluation split applied)."
	case p.Part == workload.PartTune:
		return fmt.Sprintf("Held-out protocol: TUNING PART of %s (%s). These figures are for tuning; evaluation figures come from the evaluation part.", p.Workload, p.Rule)
	case len(c.inSample) > 0:
		return fmt.Sprintf("Held-out protocol: evaluation part of %s (%s). IN-SAMPLE (runs only with --allow-in-sample): %s.", p.Workload, p.Rule, inSampleText(c.inSample, p))
	}
	return fmt.Sprintf("Held-out protocol: evaluation part of %s (%s); no policy here was tuned on it.", p.Workload, p.Rule)
}
