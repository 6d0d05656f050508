package chaos

import (
	"fmt"
	"time"

	"github.com/anishathalye/porcupine"
)

// binding is the model's state: one session's binding in the bucket.
// Worker "?" is a binding whose worker is unknown: one written by a request
// that failed (its effect, if any, named no worker to its client). The next
// reply that names the binding fixes the worker.
type binding struct {
	Bound   bool
	Worker  string
	Version uint64
}

const unknownWorker = "?"

func (b binding) String() string {
	if !b.Bound {
		return "unbound"
	}
	return fmt.Sprintf("%s v%d", b.Worker, b.Version)
}

// matches reports whether a reply naming worker w at version v agrees with
// the state, and the state with the worker fixed.
func (b binding) matches(w string, v uint64) (bool, binding) {
	if !b.Bound || b.Version != v || (b.Worker != w && b.Worker != unknownWorker) {
		return false, b
	}
	return true, binding{Bound: true, Worker: w, Version: v}
}

// step returns the states a session's binding can be in after op, starting
// from b; none when op is impossible from b.
//
//   - created: only when unbound, version 1;
//   - fresh, renewed, kept_other, a read naming a binding: the current
//     binding (worker and version);
//   - rebound: version+1 of a bound session, to any worker;
//   - a read's 404: only when unbound;
//   - binding_rejected: bound, to the worker the error names;
//   - a failed request: unchanged, or (as if it had created or re-bound)
//     the next version on an unknown worker.
func step(b binding, op *Op) []binding {
	switch {
	case op.Failed():
		if op.Kind == Read {
			return []binding{b}
		}
		next := binding{Bound: true, Worker: unknownWorker, Version: 1}
		if b.Bound {
			next.Version = b.Version + 1
		}
		return []binding{b, next}
	case op.Absent():
		if b.Bound {
			return nil
		}
		return []binding{b}
	case op.Code == "binding_rejected":
		if !b.Bound {
			return nil
		}
		if op.RejectedFor == "" {
			return []binding{b}
		}
		if ok, nb := b.matches(op.RejectedFor, b.Version); ok {
			return []binding{nb}
		}
		return nil
	}
	switch op.Outcome {
	case "created":
		if b.Bound || op.Version != 1 {
			return nil
		}
		return []binding{{Bound: true, Worker: op.Bound, Version: 1}}
	case "rebound":
		if !b.Bound || op.Version != b.Version+1 {
			return nil
		}
		return []binding{{Bound: true, Worker: op.Bound, Version: op.Version}}
	default: // fresh, renewed, kept_other, or a read
		if ok, nb := b.matches(op.Bound, op.Version); ok {
			return []binding{nb}
		}
		return nil
	}
}

// Model is the porcupine model of one session's binding; histories are
// partitioned per session.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			idx := map[string]int{}
			var out [][]porcupine.Operation
			for _, o := range h {
				s := o.Input.(*Op).Session
				i, ok := idx[s]
				if !ok {
					i = len(out)
					idx[s] = i
					out = append(out, nil)
				}
				out[i] = append(out[i], o)
			}
			return out
		},
		Init: func() []any { return []any{binding{}} },
		Step: func(state, input, _ any) []any {
			var out []any
			for _, b := range step(state.(binding), input.(*Op)) {
				out = append(out, b)
			}
			return out
		},
		Equal:             func(a, b any) bool { return a.(binding) == b.(binding) },
		DescribeOperation: func(input, _ any) string { return describe(input.(*Op)) },
		DescribeState:     func(s any) string { return s.(binding).String() },
	}
	return nm.ToModel()
}

// describe is one op in a line: what the client asked and what came back.
func describe(o *Op) string {
	head := fmt.Sprintf("c%d %s %s via %s", o.Client, o.Kind, o.Session, o.Via)
	switch {
	case o.Transport != "":
		return head + " -> no answer: " + o.Transport
	case o.Code == "binding_rejected":
		return fmt.Sprintf("%s -> 409 rejected, bound to %s", head, o.RejectedFor)
	case o.Code == "internal":
		return fmt.Sprintf("%s -> %d %s: %s", head, o.Status, o.Code, o.Message)
	case o.Code != "":
		return fmt.Sprintf("%s -> %d %s", head, o.Status, o.Code)
	case o.Kind == Read:
		return fmt.Sprintf("%s -> %s v%d (%s)", head, o.Bound, o.Version, o.Replica)
	}
	return fmt.Sprintf("%s -> %s %s v%d (%s)", head, o.Outcome, o.Bound, o.Version, o.Replica)
}

// operations turns a session's ops into porcupine's form. A failed request
// may take effect at any time after its invoke: its return is end.
func operations(ops []Op, end time.Duration) []porcupine.Operation {
	out := make([]porcupine.Operation, 0, len(ops))
	for i := range ops {
		o := &ops[i]
		if o.Failed() && o.Kind == Read {
			continue // no effect, and it names nothing
		}
		ret := o.Return
		if o.Failed() && o.Kind == Route {
			ret = end
		}
		out = append(out, porcupine.Operation{ClientId: o.Client, Input: o, Output: o,
			Call: int64(o.Invoke), Return: int64(ret)})
	}
	return out
}
