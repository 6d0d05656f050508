package host

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Events of workers not in the registry.
//
// Only a registered worker's events reach the index: anything else would
// stay there for good (only a registry departure removes a worker) and
// travel on in every snapshot. A worker writes its registration before it
// publishes, but the registry watch and the event stream are two
// subscriptions, so its first batches may arrive first. They are held for
// IndexLimits.EventHoldGrace, bounded in batches and blocks, and applied in
// order when the registration arrives; past the grace or the bounds they
// are dropped. Everything is counted in kvr.events.unregistered by result
// (held, released, dropped).

// admit lets a registered worker's events into ms's index: each of its
// ranks is capped at IndexKVBlocksSlack times the kv_blocks it registered,
// and what was held for it is applied.
func (in *eventIntake) admit(ms *modelState, i workers.Info) {
	if i.KVBlocks > 0 {
		ms.index.SetWorkerLimit(i.ID, min(i.KVBlocks, math.MaxInt/IndexKVBlocksSlack)*IndexKVBlocksSlack)
	}
	in.release(ms, i.ID)
}

// maxHeldBlocks bounds the blocks and removed hashes held in all, so that
// a few huge batches cannot take what IndexLimits.EventHoldMax allows in
// count.
const maxHeldBlocks = 1 << 16

// heldBatch is a deep copy of one batch waiting for its worker.
type heldBatch struct {
	seq    uint64
	at     time.Time
	ms     *modelState
	batch  kvevents.Batch
	blocks int
}

// holdQueue holds batches of unregistered workers, oldest first. Its mutex
// also orders a release against the subscriber's next batch of the same
// worker, so held batches are applied before later ones.
type holdQueue struct {
	mu     sync.Mutex
	q      []heldBatch
	blocks int
	n      atomic.Int64 // len(q), read without the lock on every batch
	// unlogged counts the batches dropped since the last log line, which
	// expire writes at most once a second.
	unlogged uint64

	held, released, dropped atomic.Uint64
}

// unregisteredResults are the result attributes of kvr.events.unregistered.
var unregisteredResults = [...]string{"held", "released", "dropped"}

func (h *holdQueue) count(m *metrics, result int, n uint64) {
	c := [...]*atomic.Uint64{&h.held, &h.released, &h.dropped}[result]
	c.Add(n)
	m.unregistered.Add(context.Background(), int64(n), m.unregisteredOpts[result]...)
}

const (
	resHeld = iota
	resReleased
	resDropped
)

// registered reports whether worker is in ms's registry view.
func (ms *modelState) registered(worker string) bool {
	_, ok := (*ms.workers.Load())[worker]
	return ok
}

// apply hands b to ms's index if its worker is registered, first applying
// what was held for it; otherwise b is held or dropped. It runs on the
// subscriber's goroutine.
func (in *eventIntake) apply(ms *modelState, seq uint64, b *kvevents.Batch) bool {
	h := &in.hold
	if ms.registered(b.Worker) {
		if h.n.Load() == 0 {
			ms.index.ApplyBatch(seq, b)
			return true
		}
		h.mu.Lock()
		in.releaseLocked(ms, b.Worker)
		ms.index.ApplyBatch(seq, b)
		h.mu.Unlock()
		return true
	}
	cfg := in.cfg
	blocks := batchBlocks(b)
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	// The registration may have landed since the check above, and its
	// release found nothing held yet: look again under the lock that
	// release takes, so the batch is either applied here or held where
	// that release (or a later one) finds it.
	if ms.registered(b.Worker) {
		in.releaseLocked(ms, b.Worker)
		ms.index.ApplyBatch(seq, b)
		return true
	}
	in.expireLocked(now)
	if cfg.IndexLimits.EventHoldGrace <= 0 || len(h.q) >= cfg.IndexLimits.EventHoldMax || h.blocks+blocks > maxHeldBlocks {
		h.count(in.m, resDropped, 1)
		h.unlogged++
		return false
	}
	h.q = append(h.q, heldBatch{seq: seq, at: now, ms: ms, batch: copyBatch(b), blocks: blocks})
	h.blocks += blocks
	h.n.Store(int64(len(h.q)))
	h.count(in.m, resHeld, 1)
	return false
}

// release applies what is held for worker of ms (it just registered). It
// always takes the hold's lock, even with nothing held: a batch that
// found the worker unregistered may be on its way into the hold, and the
// lock orders the two (apply looks at the registration again under it).
// Registrations are rare; batches keep their lock-free path.
func (in *eventIntake) release(ms *modelState, worker string) {
	in.hold.mu.Lock()
	in.releaseLocked(ms, worker)
	in.hold.mu.Unlock()
}

// releaseLocked applies, in stream order, worker's held batches whose
// grace has not run out, and keeps the others' (hold.mu held).
func (in *eventIntake) releaseLocked(ms *modelState, worker string) {
	h := &in.hold
	in.expireLocked(time.Now())
	kept := h.q[:0]
	for i := range h.q {
		hb := &h.q[i]
		if hb.ms != ms || hb.batch.Worker != worker {
			kept = append(kept, *hb)
			continue
		}
		ms.index.ApplyBatch(hb.seq, &hb.batch)
		h.blocks -= hb.blocks
		h.count(in.m, resReleased, 1)
	}
	clear(h.q[len(kept):])
	h.q = kept
	h.n.Store(int64(len(h.q)))
}

// forget drops what is held for worker of ms (it departed).
func (in *eventIntake) forget(ms *modelState, worker string) {
	h := &in.hold
	if h.n.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := h.q[:0]
	for i := range h.q {
		if hb := &h.q[i]; hb.ms == ms && hb.batch.Worker == worker {
			h.blocks -= hb.blocks
			h.count(in.m, resDropped, 1)
			h.unlogged++
			continue
		}
		kept = append(kept, h.q[i])
	}
	clear(h.q[len(kept):])
	h.q = kept
	h.n.Store(int64(len(h.q)))
}

// expire drops the held batches older than the grace and logs what was
// dropped since its last call (the lag loop calls it every second, so held
// batches do not wait for the next batch and the log for a flood is one
// line a second).
func (in *eventIntake) expire(now time.Time) {
	h := &in.hold
	h.mu.Lock()
	in.expireLocked(now)
	n := h.unlogged
	h.unlogged = 0
	h.mu.Unlock()
	if n > 0 {
		in.log.Warn("event batches of workers not in the registry dropped (no registration within the grace, or the hold was full)",
			"batches", n, "grace", in.cfg.IndexLimits.EventHoldGrace, "max_held", in.cfg.IndexLimits.EventHoldMax)
	}
}

func (in *eventIntake) expireLocked(now time.Time) {
	h := &in.hold
	i := 0
	for i < len(h.q) && now.Sub(h.q[i].at) > in.cfg.IndexLimits.EventHoldGrace {
		h.blocks -= h.q[i].blocks
		i++
	}
	if i == 0 {
		return
	}
	h.count(in.m, resDropped, uint64(i))
	h.unlogged += uint64(i)
	n := copy(h.q, h.q[i:])
	clear(h.q[n:])
	h.q = h.q[:n]
	h.n.Store(int64(n))
}

// batchBlocks is the number of stored blocks and removed hashes in b.
func batchBlocks(b *kvevents.Batch) int {
	n := 0
	for i := range b.Events {
		n += len(b.Events[i].Blocks) + len(b.Events[i].Removed) + len(b.Events[i].RemovedSeqs)
	}
	return n
}

// copyBatch deep-copies b: the subscriber reuses what b points to.
func copyBatch(b *kvevents.Batch) kvevents.Batch {
	cp := *b
	cp.Events = make([]kvevents.Event, len(b.Events))
	for i, e := range b.Events {
		e.Blocks = append([]kvevents.StoredBlock(nil), e.Blocks...)
		e.Removed = append([]kvevents.EngineHash(nil), e.Removed...)
		e.RemovedSeqs = append([]kvevents.SeqHash(nil), e.RemovedSeqs...)
		cp.Events[i] = e
	}
	return cp
}

// unregisteredAttrs builds the cached attribute options of
// kvr.events.unregistered, by result.
func unregisteredAttrs() [3][]metric.AddOption {
	var out [3][]metric.AddOption
	for i, r := range unregisteredResults {
		out[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("result", r)))}
	}
	return out
}
