package host

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
)

// modelState is everything a replica keeps for one model.
type modelState struct {
	name  string
	index *index.Index
	pred  *index.Approx // predicted index: this replica's recent decisions; nil when off
	// approx: pred is the approximate index (Config.Approximate) and index
	// stays empty (no events); lookups read pred alone.
	approx bool
	sched  *scheduler.Scheduler

	blockSize int // fixed per model: the scheduler and the index hash at it

	// workers and endpoints change rarely (membership) and are read on
	// every request: copy-on-write behind an atomic pointer.
	mu      sync.Mutex // serialises writers
	workers atomic.Pointer[map[string]workers.Info]

	// fences maps request id -> booking fence of the requests this replica
	// booked, so lifecycle calls need only the request id.
	fences fenceMap

	predCh chan predRecord // decisions waiting to be recorded in pred

	peers modelSync // replica sync's buffers and counters (peersync.go)

	snapRejected atomic.Uint64 // snapshot versions refused by verifySnapshot

	// lastReport holds the last load report of each worker rank, for GET
	// /v1/workers (the scheduler folds each into its load view on arrival).
	reportedMu sync.Mutex
	lastReport map[workerref.Target]workers.LoadReport
}

// recordLoad keeps l as the last report of its rank.
func (ms *modelState) recordLoad(l workers.LoadReport) {
	ms.reportedMu.Lock()
	if ms.lastReport == nil {
		ms.lastReport = map[workerref.Target]workers.LoadReport{}
	}
	ms.lastReport[workerref.Target{Worker: l.Worker, Rank: l.Rank}] = l
	ms.reportedMu.Unlock()
}

// reportedLoad returns the last report of k, if any.
func (ms *modelState) reportedLoad(k workerref.Target) (workers.LoadReport, bool) {
	ms.reportedMu.Lock()
	defer ms.reportedMu.Unlock()
	l, ok := ms.lastReport[k]
	return l, ok
}

// forgetLoad drops the reports of a departed worker.
func (ms *modelState) forgetLoad(worker string) {
	ms.reportedMu.Lock()
	for k := range ms.lastReport {
		if k.Worker == worker {
			delete(ms.lastReport, k)
		}
	}
	ms.reportedMu.Unlock()
}

func (r *Replica) newModel(name string) (*modelState, error) {
	ms := &modelState{
		name:      name,
		blockSize: r.cfg.BlockSize,
	}
	ms.fences.init()
	empty := map[string]workers.Info{}
	ms.workers.Store(&empty)
	ms.index = index.New(r.cfg.indexConfig(name))
	switch {
	case r.cfg.Approximate:
		ms.pred = index.NewApprox(index.ApproxConfig{TTL: r.cfg.ApproxTTL, MaxBlocks: r.cfg.ApproxMaxBlocks})
		ms.predCh = make(chan predRecord, predQueue)
		ms.approx = true
	case r.cfg.PredictedTTL > 0:
		ms.pred = index.NewApprox(index.ApproxConfig{TTL: r.cfg.PredictedTTL})
		ms.predCh = make(chan predRecord, predQueue)
	}
	ms.peers.init(r.cfg.BookingSyncBuffer, r.cfg.DecisionSyncBuffer, ms.pred != nil)
	pol, err := r.cfg.PolicyRegistry.Build(r.cfg.Policy)
	if err != nil {
		return nil, fmt.Errorf("%w: model %q: %w", ErrConfig, name, err)
	}
	scfg := r.cfg.Scheduler
	scfg.Model = name
	scfg.Replica = r.id
	scfg.BlockSize = ms.blockSize
	scfg.Logger = r.log.With("component", "scheduler", "model", name)
	scfg.OnBookingChange = func(ev scheduler.BookingEvent) { r.onBookingChange(ms, ev) }
	if scfg.Refresh == nil {
		scfg.Refresh = ms.refresh
	}
	ms.sched, err = scheduler.New(scfg, pol)
	if err != nil {
		return nil, fmt.Errorf("%w: model %q scheduler: %w", ErrConfig, name, err)
	}
	return ms, nil
}

// refresh recomputes a long waiter's overlaps from the index (called from
// the scheduler under its lock; lookups are lock-free).
func (ms *modelState) refresh(req *scheduler.Request, dst []scheduler.Overlap) []scheduler.Overlap {
	var ov, pov index.Overlaps
	return ms.overlaps(req.SeqHashes, &ov, &pov, dst)
}

// overlaps looks hashes up in the model's indexes (into ov and pov, scratch)
// and appends one entry per index and worker to dst: the event-fed index's
// with Reported set (the engines' events report those blocks), the
// predicted index's without. The scheduler takes the largest of each
// (scheduler.Overlap). In approximate mode the predicted index is the only
// one.
func (ms *modelState) overlaps(hashes []kvevents.SeqHash, ov, pov *index.Overlaps, dst []scheduler.Overlap) []scheduler.Overlap {
	ov.Reset()
	pov.Reset()
	if ms.approx {
		ms.pred.Lookup(hashes, index.LookupOptions{}, pov)
	} else {
		ms.index.Lookup(hashes, index.LookupOptions{}, ov)
		for _, w := range ov.Workers {
			dst = append(dst, scheduler.Overlap{Key: w.Key, Blocks: w.Blocks, Reported: w.Blocks})
		}
		if ms.pred != nil {
			ms.pred.Lookup(hashes, index.LookupOptions{}, pov)
		}
	}
	for _, w := range pov.Workers {
		dst = append(dst, scheduler.Overlap{Key: w.Key, Blocks: w.Blocks})
	}
	return dst
}

func (ms *modelState) close() { ms.sched.Close() }

// onBookingChange is the scheduler's hook: it must not block (it runs
// under the scheduler's lock). A freed booking of this replica loses its fence;
// every change goes to the peers.
func (r *Replica) onBookingChange(ms *modelState, ev scheduler.BookingEvent) {
	if ev.Kind == scheduler.BookingFree && ev.Replica == r.id {
		// Expired or rolled back: the request id no longer has a booking.
		ms.fences.del(scheduler.Fence{RequestID: ev.RequestID, Worker: workerKeyOf(ev.Worker, ev.Rank), Attempt: ev.Attempt})
	}
	r.share.shareBooking(ms, ev)
}

// endpoint returns the registered endpoint of a worker.
func (ms *modelState) endpoint(worker string) string {
	if i, ok := (*ms.workers.Load())[worker]; ok {
		return i.Endpoint
	}
	return ""
}

// setWorker records or replaces a worker's info (nil info deletes).
func (ms *modelState) setWorker(id string, info *workers.Info) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	old := *ms.workers.Load()
	next := make(map[string]workers.Info, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	if info == nil {
		delete(next, id)
	} else {
		next[id] = *info
	}
	ms.workers.Store(&next)
}

// workerList returns the worker infos sorted by id.
func (ms *modelState) workerList() []workers.Info {
	m := *ms.workers.Load()
	out := make([]workers.Info, 0, len(m))
	for _, i := range m {
		out = append(out, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// fenceMap maps request ids to booking fences, sharded to keep lock
// contention off the hot path.
type fenceMap struct {
	shards [32]fenceShard
}

type fenceShard struct {
	mu sync.Mutex
	m  map[string]scheduler.Fence
}

func (f *fenceMap) init() {
	for i := range f.shards {
		f.shards[i].m = make(map[string]scheduler.Fence)
	}
}

func (f *fenceMap) shard(id string) *fenceShard {
	// FNV-1a over the id.
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return &f.shards[h%uint32(len(f.shards))]
}

func (f *fenceMap) put(fe scheduler.Fence) {
	s := f.shard(fe.RequestID)
	s.mu.Lock()
	s.m[fe.RequestID] = fe
	s.mu.Unlock()
}

func (f *fenceMap) get(id string) (scheduler.Fence, bool) {
	s := f.shard(id)
	s.mu.Lock()
	fe, ok := s.m[id]
	s.mu.Unlock()
	return fe, ok
}

// del removes id's fence if it is fe (a newer attempt's fence stays).
func (f *fenceMap) del(fe scheduler.Fence) {
	s := f.shard(fe.RequestID)
	s.mu.Lock()
	if cur, ok := s.m[fe.RequestID]; ok && cur == fe {
		delete(s.m, fe.RequestID)
	}
	s.mu.Unlock()
}

func (f *fenceMap) len() int {
	n := 0
	for i := range f.shards {
		s := &f.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// workerKeyOf converts a bindings/scheduler style target into the key of
// one rank.
func workerKeyOf(worker string, rank uint32) workerref.Target {
	return workerref.Target{Worker: worker, Rank: rank}
}
