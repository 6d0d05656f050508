package workload

import "strconv"

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
