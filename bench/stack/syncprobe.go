package stack

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/router/host"
)

// syncProbe measures how far two router replicas' views of the fleet drift
// apart while a replay runs: every interval it reads each replica's
// /v1/workers view (in process) and records, summed over the workers, how
// many booked requests and indexed blocks the first two replicas disagree
// on, as a fraction of what they hold. Booking sync and decision sync lag
// show up as that disagreement; 0 means the replicas decide on the same
// view.
type syncProbe struct {
	stop   context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	load   []float64 // per sample: Σ|Δ booked requests| / Σ booked requests
	index  []float64 // per sample: Σ|Δ indexed blocks| / Σ indexed blocks
	sample time.Duration
}

func startSyncProbe(a, b *host.Replica, model string, every time.Duration) *syncProbe {
	ctx, stop := context.WithCancel(context.Background())
	p := &syncProbe{stop: stop, done: make(chan struct{}), sample: every}
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			wa, errA := a.Workers(model)
			wb, errB := b.Workers(model)
			if errA != nil || errB != nil {
				continue
			}
			type view struct{ active, indexed int }
			bv := map[string]view{}
			for _, w := range wb.Workers {
				v := view{indexed: w.IndexedBlocks}
				if w.Load != nil {
					v.active = w.Load.ActiveRequests
				}
				bv[fmt.Sprintf("%s#%d", w.Worker, w.Rank)] = v
			}
			var dAct, sAct, dIdx, sIdx int
			for _, w := range wa.Workers {
				va := view{indexed: w.IndexedBlocks}
				if w.Load != nil {
					va.active = w.Load.ActiveRequests
				}
				vb := bv[fmt.Sprintf("%s#%d", w.Worker, w.Rank)]
				dAct += abs(va.active - vb.active)
				sAct += max(va.active, vb.active)
				dIdx += abs(va.indexed - vb.indexed)
				sIdx += max(va.indexed, vb.indexed)
			}
			p.mu.Lock()
			if sAct > 0 {
				p.load = append(p.load, float64(dAct)/float64(sAct))
			}
			if sIdx > 0 {
				p.index = append(p.index, float64(dIdx)/float64(sIdx))
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// close stops sampling and returns the report lines.
func (p *syncProbe) close() []string {
	p.stop()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	q := func(v []float64) string {
		if len(v) == 0 {
			return "no samples"
		}
		s := slices.Sorted(slices.Values(v))
		return fmt.Sprintf("median %.1f %%, p90 %.1f %%, p99 %.1f %% of %d samples", 100*s[len(s)/2], 100*s[len(s)*9/10], 100*s[len(s)*99/100], len(s))
	}
	return []string{
		fmt.Sprintf("replica views every %v: booked requests the two replicas disagree on (Σ|Δ| / Σ max): %s", p.sample, q(p.load)),
		fmt.Sprintf("replica views every %v: indexed blocks the two replicas disagree on: %s", p.sample, q(p.index)),
	}
}
