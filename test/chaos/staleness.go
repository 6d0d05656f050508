package chaos

import (
	"maps"
	"slices"
	"time"
)

// StaleRead is a reply that served a binding older than one whose commit
// had already returned to its client.
type StaleRead struct {
	Op Op
	// Newer is the version that was committed, and By how long before Op's
	// invoke its commit returned.
	Newer uint64
	By    time.Duration
}

// Staleness measures, for every reply of the sessions in ops that names a
// binding (or a read's 404), how far behind the bucket it was: the time
// between the return of the earliest commit (a created or rebound reply)
// of a newer version and the reply's invoke. A reply is stale by zero when
// no newer commit had returned before it was sent. It returns the worst
// reply and every reply stale by more than bound.
func Staleness(ops []Op, bound time.Duration) (worst StaleRead, over []StaleRead) {
	sessions := bySession(ops, func(o *Op) bool { return o.OK() || o.Absent() })
	for _, s := range slices.Sorted(maps.Keys(sessions)) {
		sops := sessions[s]
		// committed[v] is when the first commit of version v returned.
		committed := map[uint64]time.Duration{}
		for i := range sops {
			o := &sops[i]
			if o.Kind == Route && (o.Outcome == "created" || o.Outcome == "rebound") {
				if at, ok := committed[o.Version]; !ok || o.Return < at {
					committed[o.Version] = o.Return
				}
			}
		}
		for i := range sops {
			o := &sops[i]
			served := o.Version // 0 for a 404
			var sr StaleRead
			for v, at := range committed {
				if v > served && at < o.Invoke && o.Invoke-at > sr.By {
					sr = StaleRead{Op: *o, Newer: v, By: o.Invoke - at}
				}
			}
			if sr.By > worst.By {
				worst = sr
			}
			if sr.By > bound {
				over = append(over, sr)
			}
		}
	}
	return worst, over
}
