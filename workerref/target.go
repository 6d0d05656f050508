package workerref

import (
	"fmt"
	"strconv"
	"strings"
)

// Target names one data-parallel rank of one worker (the unit that owns a KV
// cache; Rank is 0 for a worker without data parallelism) or, with AnyRank
// set, every rank of its worker. The zero AnyRank means an exact rank, so a
// literal Target{Worker: w} is rank 0 of w: the form events and the index
// use as a map key.
type Target struct {
	Worker  string
	Rank    uint32
	AnyRank bool
}

// Of returns the target of one exact (worker, rank).
func Of(worker string, rank uint32) Target { return Target{Worker: worker, Rank: rank} }

// Any returns the target of every rank of worker.
func Any(worker string) Target { return Target{Worker: worker, AnyRank: true} }

// String renders "worker" or "worker#rank", the one printed form of a target
// in errors, logs, spans and metrics.
func (t Target) String() string {
	if t.AnyRank {
		return t.Worker
	}
	return t.Worker + "#" + strconv.FormatUint(uint64(t.Rank), 10)
}

// Agrees reports whether t and u can name the same (worker, rank): the same
// worker and, where both name a rank, the same rank. A worker-only target
// agrees with every rank of its worker, in either direction. It is the one
// agreement rule: the bindings table uses it to decide whether a selection
// keeps a binding, the scheduler's pin rule to decide whether a pin agrees
// with an affinity target, so a pin the table would accept is never refused
// by the scheduler.
func (t Target) Agrees(u Target) bool {
	if t.Worker != u.Worker {
		return false
	}
	return t.AnyRank || u.AnyRank || t.Rank == u.Rank
}

// Contains reports whether the exact (worker, rank) is inside t.
func (t Target) Contains(worker string, rank uint32) bool {
	return worker == t.Worker && (t.AnyRank || rank == t.Rank)
}

// Parse inverts String: "w" is worker w with no rank, "w#3" is rank 3 of w.
// The last '#' separates the rank, so a worker id may itself contain '#'
// when a rank is given.
func Parse(s string) (Target, error) {
	i := strings.LastIndexByte(s, '#')
	if i < 0 {
		if s == "" {
			return Target{}, fmt.Errorf("workerref: empty target")
		}
		return Any(s), nil
	}
	r, err := strconv.ParseUint(s[i+1:], 10, 32)
	if err != nil || i == 0 {
		return Target{}, fmt.Errorf("workerref: target %q: want worker or worker#rank", s)
	}
	return Of(s[:i], uint32(r)), nil
}
