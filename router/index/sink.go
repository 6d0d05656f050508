package index

import "github.com/kvrouter/kvrouter/kvevents"

// The index is what the event subscriber feeds.
var (
	_ kvevents.Sink         = (*Index)(nil)
	_ kvevents.CursorSource = (*Index)(nil)
)

// Resync drops everything held for the signalled (worker, rank) and
// forgets its cursor (kvevents.Sink): events were lost or the worker
// restarted. The batch that revealed it follows through ApplyBatch.
// Signals for another model than Config.Model are ignored.
func (x *Index) Resync(sig kvevents.Signal) {
	if x.cfg.Model != "" && sig.Model != "" && sig.Model != x.cfg.Model {
		x.ctr.foreignModel.Add(1)
		return
	}
	x.resync(sig.Key())
}
