package workload

import (
	"fmt"
	"strings"
)

// Part names one side of the held-out split (docs/benchmarks/replay.md,
// "Held-out protocol"): policies are tuned on the tuning part of a workload
// and judged on its evaluation part, which no tuning has seen.
type Part string

const (
	PartTune Part = "tune" // where a configuration may be chosen
	PartEval Part = "eval" // where it is judged
)

// ParsePart accepts tune or eval (any case).
func ParsePart(s string) (Part, error) {
	switch p := Part(strings.ToLower(strings.TrimSpace(s))); p {
	case PartTune, PartEval:
		return p, nil
	}
	return "", fmt.Errorf("%w: part %q (want tune or eval)", ErrInvalid, s)
}

// EvalSeedOffset separates a generated workload's parts: --seed s (1..100)
// generates seed s for the tuning part and seed s + EvalSeedOffset for the
// evaluation part, so the two never share a seed.
const EvalSeedOffset = 100

// PartInfo says which part of which workload a replay ran, and how it was
// cut, so that a report can state it and the harness can check it against
// what a policy was tuned on.
type PartInfo struct {
	Part     Part   `json:"part"`
	Workload string `json:"workload"` // the whole workload's name
	Rule     string `json:"rule"`     // how the part was cut, in words
	// First and End are the indexes in the whole workload of the part's
	// first request and one past its last (a trace's part is one run of
	// requests); Total is the whole workload's size.
	First int `json:"first"`
	End   int `json:"end"`
	Total int `json:"total"`
	// Seed is the seed a generated part was generated from (0 for traces).
	Seed uint64 `json:"seed,omitempty"`
}

// HoldsAnyOf reports whether the part holds any of the whole workload's
// first head requests.
func (p *PartInfo) HoldsAnyOf(head int) bool { return p.First < head }

// TimePart cuts a trace by time: the tuning part is every request arriving
// in the first half of the trace's time span, the evaluation part the rest.
// The part's arrivals are re-based so that its first request arrives at 0;
// prompts are shared with w.
func (w *Workload) TimePart(p Part) (*Workload, PartInfo, error) {
	if _, err := ParsePart(string(p)); err != nil {
		return nil, PartInfo{}, err
	}
	half := w.Span() / 2
	cut := len(w.Requests)
	for i := range w.Requests {
		if w.Requests[i].Arrival >= half {
			cut = i
			break
		}
	}
	info := PartInfo{Part: p, Workload: w.Name, Total: len(w.Requests), First: 0, End: cut,
		Rule: fmt.Sprintf("the first half of the trace's time span (arrivals before %.0f s of %.0f s)", half.Seconds(), w.Span().Seconds())}
	if p == PartEval {
		info.First, info.End = cut, len(w.Requests)
		info.Rule = fmt.Sprintf("the second half of the trace's time span (arrivals from %.0f s of %.0f s)", half.Seconds(), w.Span().Seconds())
	}
	info.Rule += fmt.Sprintf(": requests %d-%d of %d", info.First+1, info.End, info.Total)
	out := &Workload{Name: w.Name, BlockTokens: w.BlockTokens, MaxTokens: w.MaxTokens}
	out.Requests = append(out.Requests, w.Requests[info.First:info.End]...)
	if len(out.Requests) == 0 {
		return nil, info, fmt.Errorf("%w: %s: the %s part is empty (%d requests)", ErrInvalid, w.Name, p, len(w.Requests))
	}
	base := out.Requests[0].Arrival
	for i := range out.Requests {
		out.Requests[i].Arrival -= base
	}
	return out, info, nil
}

// PartSeed maps a seed in 1..EvalSeedOffset to the seed of the part.
func PartSeed(p Part, seed uint64) (uint64, error) {
	if _, err := ParsePart(string(p)); err != nil {
		return 0, err
	}
	if seed < 1 || seed > EvalSeedOffset {
		return 0, fmt.Errorf("%w: seed %d: a generated workload's part seed is 1..%d (the evaluation part adds %d)", ErrInvalid, seed, EvalSeedOffset, EvalSeedOffset)
	}
	if p == PartEval {
		return seed + EvalSeedOffset, nil
	}
	return seed, nil
}

// GeneratePart generates one part of a synthetic workload: seed (1..100)
// itself for the tuning part, seed + EvalSeedOffset for the evaluation part.
func GeneratePart(kind string, p Part, seed uint64) (*Workload, PartInfo, error) {
	s, err := PartSeed(p, seed)
	if err != nil {
		return nil, PartInfo{}, err
	}
	w, err := Generate(kind, s)
	if err != nil {
		return nil, PartInfo{}, err
	}
	rule := fmt.Sprintf("seeds 1-%d are the tuning part, %d-%d the evaluation part: this is seed %d", EvalSeedOffset, EvalSeedOffset+1, 2*EvalSeedOffset, s)
	return w, PartInfo{Part: p, Workload: w.Name, Rule: rule, First: 0, End: len(w.Requests), Total: len(w.Requests), Seed: s}, nil
}
