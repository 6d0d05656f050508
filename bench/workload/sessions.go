package workload

import (
	"sort"
	"strconv"
	"time"
)

// InferSessions gives session ids to a block-id workload that has none (the
// Mooncake traces carry no session field). A request continues the session of
// the earlier request it shares its longest prefix with, when that prefix is at
// least minShared blocks long; otherwise it starts a new session. minShared 0
// picks 1 + the depth of the workload's common root: the leading positions
// where a single id is shared by at least half of the requests (the
// conversation trace's first block is one system prompt shared by all, so
// sessions there are keyed by the second block). It returns the number of
// sessions. Requests that carry tokens, or already have a session, keep theirs.
func InferSessions(w *Workload, minShared int) int {
	if minShared <= 0 {
		minShared = 1 + rootDepth(w)
	}
	owner := make(map[uint64]int32)
	var next int32
	for i := range w.Requests {
		r := &w.Requests[i]
		if len(r.BlockIDs) == 0 {
			continue
		}
		k := 0
		for k < len(r.BlockIDs) {
			if _, ok := owner[r.BlockIDs[k]]; !ok {
				break
			}
			k++
		}
		var s int32
		if k >= minShared {
			s = owner[r.BlockIDs[k-1]]
		} else {
			s = next
			next++
		}
		for _, id := range r.BlockIDs {
			owner[id] = s
		}
		if r.Session == "" {
			r.Session = "s" + strconv.Itoa(int(s))
		}
	}
	return int(next)
}

// rootDepth is the number of leading block positions at which one id appears
// in at least half of the requests.
func rootDepth(w *Workload) int {
	n := len(w.Requests)
	if n == 0 {
		return 0
	}
	for depth := 0; ; depth++ {
		counts := make(map[uint64]int)
		best := 0
		for i := range w.Requests {
			ids := w.Requests[i].BlockIDs
			if len(ids) <= depth {
				continue
			}
			// An id names its whole prefix, so a majority id at this depth
			// also shares every shallower root position.
			c := counts[ids[depth]] + 1
			counts[ids[depth]] = c
			best = max(best, c)
		}
		if 2*best < n {
			return depth
		}
	}
}

// SampleSessions keeps every request of n sessions drawn deterministically
// (from seed) among the sessions with at least minRequests requests, in
// their original order and timing, re-based so the first kept request
// arrives at 0. It turns a long trace into a short one that keeps the
// reuse within sessions (a plain time slice of a conversation trace loses
// most of it: turns of one conversation are minutes apart). Requests
// without a session are dropped. n <= 0 or more than there are keeps all
// qualifying sessions.
func (w *Workload) SampleSessions(n, minRequests int, seed uint64) *Workload {
	count := map[string]int{}
	var order []string
	for i := range w.Requests {
		s := w.Requests[i].Session
		if s == "" {
			continue
		}
		if count[s] == 0 {
			order = append(order, s)
		}
		count[s]++
	}
	var eligible []string
	for _, s := range order {
		if count[s] >= minRequests {
			eligible = append(eligible, s)
		}
	}
	keep := map[string]bool{}
	if n <= 0 || n >= len(eligible) {
		for _, s := range eligible {
			keep[s] = true
		}
	} else {
		// Rank sessions by a seeded hash of their id: a deterministic draw
		// that does not depend on the order sessions appear in.
		type ranked struct {
			s string
			h uint64
		}
		rs := make([]ranked, len(eligible))
		for i, s := range eligible {
			h := seed
			for j := 0; j < len(s); j++ {
				h = mix64(h ^ uint64(s[j]))
			}
			rs[i] = ranked{s, h}
		}
		sort.Slice(rs, func(i, j int) bool { return rs[i].h < rs[j].h })
		for _, r := range rs[:n] {
			keep[r.s] = true
		}
	}
	out := &Workload{Name: w.Name, BlockTokens: w.BlockTokens, MaxTokens: w.MaxTokens}
	var base time.Duration = -1
	for _, r := range w.Requests {
		if !keep[r.Session] {
			continue
		}
		if base < 0 {
			base = r.Arrival
		}
		r.Arrival -= base
		out.Requests = append(out.Requests, r)
	}
	return out
}
