package chaos

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// CheckConfig sets what the checkers accept.
type CheckConfig struct {
	// StaleBound is how far behind the bucket a Soft reply may be (the
	// documented 1 s plus slack for a busy test machine).
	StaleBound time.Duration
	// LateSlack is how long past its deadline_ms a route may take before
	// it counts as unanswered in time.
	LateSlack time.Duration
	// Allowed are the error codes a route may fail with (the documented,
	// retryable ones); any other code is a violation, except
	// binding_rejected for a Hard session (checked by the model instead:
	// it must name the current binding).
	Allowed map[string]bool
	// SessionTimeout bounds porcupine's search per session; a session it
	// cannot decide in time is reported as unknown, not as a violation.
	SessionTimeout time.Duration
	// Kills are the workers the test crashed: a Hard session may move off
	// a worker once it was killed (its departure is real).
	Kills []Kill
	// VisualizeTo, when set, is a directory where porcupine's HTML
	// visualisation of the non-linearizable sessions is written.
	VisualizeTo string
}

// Report is the verdict of every checker over one history.
type Report struct {
	Requests int
	Routes   int
	Reads    int
	Errors   map[string]int // by code, or "transport: excused" / "transport"
	// Example is the message of the first failure of each code, to tell
	// what a count is made of.
	Example map[string]string

	// (1) linearizability of the Hard sessions' history.
	HardSessions int
	NonLinear    []string // sessions porcupine rejects
	Undecided    []string // sessions porcupine could not decide in time
	Visualized   string   // the HTML file, when written

	// (2) staleness of the Soft sessions' replies.
	SoftSessions int
	WorstStale   StaleRead
	Stale        []StaleRead // replies over the bound
	// WorstStaleHard is the same measure over the Hard sessions, for the
	// record (their bound is linearizability, checked by (1)).
	WorstStaleHard StaleRead

	// (3) Hard sessions served by more than one worker.
	Moved map[string][]string // session -> workers in order of first use

	// (4) requests unanswered, late, or failed with a code not allowed.
	Unanswered []Op
	Late       []Op
	Undocument []Op
	// Slowest is the answered route that took longest (against its
	// deadline).
	Slowest Op

	ops map[string][]Op // per session, for the summary
	end time.Duration   // the history's end, where failed requests return
}

// Failed reports whether any checker found a violation.
func (r *Report) Failed() bool {
	return len(r.NonLinear) > 0 || len(r.Stale) > 0 || len(r.Moved) > 0 ||
		len(r.Unanswered) > 0 || len(r.Late) > 0 || len(r.Undocument) > 0
}

// Check runs the four checkers over ops.
func Check(ops []Op, cfg CheckConfig) (*Report, error) {
	r := &Report{Requests: len(ops), Errors: map[string]int{}, Example: map[string]string{}, Moved: map[string][]string{},
		ops: bySession(ops, func(*Op) bool { return true })}
	var end time.Duration
	for i := range ops {
		o := &ops[i]
		if o.Kind == Read {
			r.Reads++
		} else {
			r.Routes++
		}
		if o.Return > end {
			end = o.Return
		}
		switch {
		case o.Transport != "" && o.Excused:
			r.Errors["transport (excused: a connection dropped or the network was cut)"]++
		case o.Transport != "":
			r.Errors["transport"]++
		case o.Code == "binding_rejected" && !o.Restricted:
			// Allowed (a Hard binding to a live worker that cannot take
			// the request), but worth seeing apart from the refusals the
			// clients provoke with allowed_workers.
			r.Errors["binding_rejected (no allowed_workers)"]++
		case o.Code != "":
			r.Errors[o.Code]++
			if _, ok := r.Example[o.Code]; !ok {
				r.Example[o.Code] = o.Message
			}
		}
	}
	end++
	r.end = end

	hard := bySession(ops, func(o *Op) bool { return o.Mode == Hard })
	soft := bySession(ops, func(o *Op) bool { return o.Mode == Soft })
	r.HardSessions, r.SoftSessions = len(hard), len(soft)
	if err := r.linearizable(hard, end, cfg); err != nil {
		return r, err
	}
	var over []StaleRead
	r.WorstStale, over = Staleness(flatten(soft), cfg.StaleBound)
	r.Stale = over
	r.WorstStaleHard, _ = Staleness(flatten(hard), cfg.StaleBound)
	r.moves(hard, cfg.Kills)
	r.answered(ops, cfg)
	return r, nil
}

// linearizable checks each Hard session on its own (so that one session's
// search cannot starve the others), then visualises the rejected ones
// together.
func (r *Report) linearizable(hard map[string][]Op, end time.Duration, cfg CheckConfig) error {
	model := Model()
	var bad []porcupine.Operation
	for _, s := range slices.Sorted(maps.Keys(hard)) {
		h := operations(hard[s], end)
		res, _ := porcupine.CheckOperationsVerbose(model, h, cfg.SessionTimeout)
		switch res {
		case porcupine.Illegal:
			r.NonLinear = append(r.NonLinear, s)
			bad = append(bad, h...)
		case porcupine.Unknown:
			r.Undecided = append(r.Undecided, s)
		}
	}
	if len(bad) == 0 || cfg.VisualizeTo == "" {
		return nil
	}
	_, info := porcupine.CheckOperationsVerbose(model, bad, time.Minute)
	path := filepath.Join(cfg.VisualizeTo, "hard-sessions.html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return fmt.Errorf("chaos: write visualisation %s: %w", path, err)
	}
	r.Visualized = path
	return nil
}

// moves finds Hard sessions whose successful routes went to more than one
// worker, except moves off a worker the test had killed before the first
// route to the next one was sent (a real departure). Every other move is
// a violation: no other worker ever stops.
func (r *Report) moves(hard map[string][]Op, kills []Kill) {
	for s, ops := range hard {
		var seen []string
		legit := true
		for i := range ops {
			o := &ops[i]
			if o.Kind != Route || !o.OK() || slices.Contains(seen, o.Worker) {
				continue
			}
			if len(seen) > 0 && !killedBefore(kills, seen[len(seen)-1], o.Invoke) {
				legit = false
			}
			seen = append(seen, o.Worker)
		}
		if !legit {
			r.Moved[s] = seen
		}
	}
}

// killedBefore reports whether worker (printed "w1#0" or "w1") was killed
// before at.
func killedBefore(kills []Kill, worker string, at time.Duration) bool {
	if i := strings.IndexByte(worker, '#'); i >= 0 {
		worker = worker[:i]
	}
	for _, k := range kills {
		if k.Worker == worker && k.At < at {
			return true
		}
	}
	return false
}

// answered checks that every route was answered within its deadline plus
// slack (from the heal that released it, if a cut link may have held it),
// with success or an allowed code. A request the client lost with its own
// connection is excused.
func (r *Report) answered(ops []Op, cfg CheckConfig) {
	for i := range ops {
		o := &ops[i]
		if o.Kind != Route {
			continue
		}
		if o.Transport != "" {
			if !o.Excused {
				r.Unanswered = append(r.Unanswered, *o)
			}
			continue
		}
		if o.Took() > r.Slowest.Took() {
			r.Slowest = *o
		}
		if o.Return-max(o.Invoke, o.Released) > o.Deadline+cfg.LateSlack {
			r.Late = append(r.Late, *o)
		}
		if o.Code != "" && !cfg.Allowed[o.Code] && !(o.Code == "binding_rejected" && o.Mode == Hard) {
			r.Undocument = append(r.Undocument, *o)
		}
	}
}

// firstIllegal is where a session's violation shows: the length of the
// shortest prefix of its requests (in invoke order) that porcupine rejects,
// found by bisection. Prefixes are not strictly monotone (a later request
// can explain an earlier reply), so it is a place to look, not a proof.
func firstIllegal(ops []Op, end time.Duration) int {
	model := Model()
	lo, hi := 0, len(ops) // prefix lo is accepted (or empty), hi rejected
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(model, operations(ops[:mid], end), 5*time.Second) == porcupine.Illegal {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi - 1
}

// firstMove is the index of the first successful route to a second worker.
func firstMove(ops []Op) int {
	first := ""
	for i := range ops {
		o := &ops[i]
		if o.Kind == Route && o.OK() {
			if first == "" {
				first = o.Worker
			} else if o.Worker != first {
				return i
			}
		}
	}
	return 0
}

func flatten(m map[string][]Op) []Op {
	var out []Op
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k]...)
	}
	return out
}

// Summary is the compact account printed when a check fails: counts per
// check, then the first few violating sessions with their ops.
func (r *Report) Summary(maxSessions int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "requests %d (routes %d, reads %d); errors %s\n", r.Requests, r.Routes, r.Reads, fmtCounts(r.Errors))
	for _, code := range slices.Sorted(maps.Keys(r.Example)) {
		fmt.Fprintf(&b, "    e.g. %s: %.200s\n", code, r.Example[code])
	}
	fmt.Fprintf(&b, "(1) linearizability: %d Hard sessions, %d not linearizable, %d undecided\n", r.HardSessions, len(r.NonLinear), len(r.Undecided))
	fmt.Fprintf(&b, "(2) staleness: %d Soft sessions, worst %v (%s), %d replies over the bound; worst Hard %v\n",
		r.SoftSessions, r.WorstStale.By.Round(time.Millisecond), staleLine(r.WorstStale), len(r.Stale), r.WorstStaleHard.By.Round(time.Millisecond))
	fmt.Fprintf(&b, "(3) Hard sessions served by two workers: %d\n", len(r.Moved))
	fmt.Fprintf(&b, "(4) routes unanswered %d, late %d, failed with a code not allowed %d; slowest answer %v (deadline %v): %s\n",
		len(r.Unanswered), len(r.Late), len(r.Undocument), r.Slowest.Took().Round(time.Millisecond), r.Slowest.Deadline, describe(&r.Slowest))
	if r.Visualized != "" {
		fmt.Fprintf(&b, "porcupine visualisation: %s\n", r.Visualized)
	}
	if maxSessions <= 0 {
		return b.String()
	}
	show := func(what, s string, from int) {
		fmt.Fprintf(&b, "--- %s: session %s (%d requests)\n", what, s, len(r.ops[s]))
		ops := r.ops[s]
		if from > 0 {
			fmt.Fprintf(&b, "    ... %d before\n", from)
		}
		for i := from; i < len(ops); i++ {
			if i >= from+20 {
				fmt.Fprintf(&b, "    ... %d more\n", len(ops)-i)
				break
			}
			fmt.Fprintf(&b, "    [%8.3fs %8.3fs] %s\n", ops[i].Invoke.Seconds(), ops[i].Return.Seconds(), describe(&ops[i]))
		}
	}
	for i, s := range r.NonLinear {
		if i >= maxSessions {
			fmt.Fprintf(&b, "    ... %d more not linearizable\n", len(r.NonLinear)-i)
			break
		}
		show("not linearizable", s, max(0, firstIllegal(r.ops[s], r.end)-15))
	}
	for i, s := range slices.Sorted(maps.Keys(r.Moved)) {
		if i >= maxSessions {
			fmt.Fprintf(&b, "    ... %d more moved\n", len(r.Moved)-i)
			break
		}
		show("moved "+strings.Join(r.Moved[s], " -> "), s, max(0, firstMove(r.ops[s])-10))
	}
	for i, sr := range r.Stale {
		if i >= maxSessions {
			break
		}
		fmt.Fprintf(&b, "--- stale: %s\n", staleLine(sr))
	}
	for _, list := range []struct {
		what string
		ops  []Op
	}{{"unanswered", r.Unanswered}, {"late", r.Late}, {"code not allowed", r.Undocument}} {
		for i, o := range list.ops {
			if i >= maxSessions {
				fmt.Fprintf(&b, "    ... %d more %s\n", len(list.ops)-i, list.what)
				break
			}
			fmt.Fprintf(&b, "--- %s after %v (deadline %v): [%8.3fs] %s\n", list.what, o.Took().Round(time.Millisecond), o.Deadline, o.Invoke.Seconds(), describe(&o))
		}
	}
	return b.String()
}

func staleLine(sr StaleRead) string {
	if sr.By == 0 {
		return "none"
	}
	return fmt.Sprintf("[%.3fs] %s, %v after v%d had been committed", sr.Op.Invoke.Seconds(), describe(&sr.Op), sr.By.Round(time.Millisecond), sr.Newer)
}

func fmtCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
