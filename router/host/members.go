package host

import (
	"context"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers"
)

// startMembership watches the worker registry and the load reports and
// feeds the schedulers, the indexes and the endpoint table.
func (r *Replica) startMembership(ctx context.Context) error {
	rc := r.cfg.Registry
	rc.Model = "" // one view for every model; callbacks dispatch
	rc.Logger = r.log
	if rc.Replicas == 0 {
		rc.Replicas = r.cfg.StreamReplicas
	}
	m, err := workers.WatchMembership(ctx, r.js, rc, workers.Callbacks{
		OnJoin:    r.onJoin,
		OnUpdate:  r.onUpdate,
		OnSuspect: r.onSuspect,
		OnDepart:  r.onDepart,
	})
	if err != nil {
		return fmt.Errorf("host: worker membership: %w", err)
	}
	r.mem.Store(m)
	ls, err := workers.SubscribeLoad(r.nc, r.cfg.Prefix, "", r.onLoad, workers.WithLoadLogger(r.log))
	if err != nil {
		return fmt.Errorf("host: load reports: %w", err)
	}
	r.loadSub = ls
	r.loadStats.Store(ls)
	return nil
}

func (r *Replica) onJoin(i workers.Info) {
	ms, ok := r.models[i.Model]
	if !ok {
		return
	}
	if i.BlockSize != 0 && i.BlockSize != ms.blockSize {
		// The index and the scheduler hash at one block size per model:
		// a worker with another cannot be matched, so it is not used.
		r.log.Error("worker ignored: its block size differs from the model's", "worker", i.ID, "model", i.Model,
			"worker_block_size", i.BlockSize, "model_block_size", ms.blockSize)
		return
	}
	ms.setWorker(i.ID, &i)
	r.gate.admit(ms, i)
	r.upsert(ms, i, i.Available(), i.State == workers.StateDraining)
	r.log.Info("worker joined", "worker", i.ID, "model", i.Model, "ranks", len(i.Ranks), "endpoint", i.Endpoint,
		"kv_blocks", i.KVBlocks, "epoch", i.Epoch)
}

func (r *Replica) onUpdate(i workers.Info) {
	ms, ok := r.models[i.Model]
	if !ok {
		return
	}
	if _, known := (*ms.workers.Load())[i.ID]; !known {
		return // ignored at join (block size)
	}
	// The scheduler first: once the replica shows the new state (GET
	// /v1/workers reads ms.workers), routing follows it. The worker's
	// entry exists since its join: a route in between reads the previous one.
	r.upsert(ms, i, i.Available(), i.State == workers.StateDraining)
	ms.setWorker(i.ID, &i)
	r.gate.admit(ms, i)
	r.log.Info("worker updated", "worker", i.ID, "model", i.Model, "state", i.State)
}

// onSuspect: the worker's registry key vanished without a deregistration
// and may come back within the departure grace (a registry failover).
// The scheduler stops choosing it, for Hard sessions too; its index
// entries, its endpoint and its bindings stay (workerLive keeps saying
// live), so a Hard binding does not move unless the departure is
// confirmed (onDepart). onUpdate restores it if it comes back.
func (r *Replica) onSuspect(i workers.Info) {
	ms, ok := r.models[i.Model]
	if !ok {
		return
	}
	if _, known := (*ms.workers.Load())[i.ID]; !known {
		return // ignored at join (block size)
	}
	r.upsert(ms, i, false, false)
	r.log.Warn("worker suspect: not chosen until its registry key comes back or the departure is confirmed",
		"worker", i.ID, "model", i.Model, "epoch", i.Epoch)
}

// upsert hands every rank of i to the scheduler. available: it takes new
// work; draining: it only serves the Hard sessions bound to it.
func (r *Replica) upsert(ms *modelState, i workers.Info, available, draining bool) {
	for _, rank := range i.Ranks {
		ms.sched.UpsertWorker(scheduler.WorkerInfo{
			Key:              workerKeyOf(i.ID, rank),
			BlockSize:        i.BlockSize,
			KVBlocks:         i.KVBlocks,
			MaxBatchedTokens: i.MaxBatchedTokens,
			MaxSeqs:          i.MaxSeqs,
			Available:        available,
			Draining:         draining,
			Role:             schedulerRole(i.Role),
		})
	}
}

// schedulerRole is a registry role as the scheduler's.
func schedulerRole(r workers.Role) scheduler.Role {
	switch r.Or() {
	case workers.RolePrefill:
		return scheduler.RolePrefill
	case workers.RoleDecode:
		return scheduler.RoleDecode
	}
	return scheduler.RoleBoth
}

func (r *Replica) onDepart(i workers.Info) {
	ms, ok := r.models[i.Model]
	if !ok {
		return
	}
	ms.setWorker(i.ID, nil)
	r.gate.forget(ms, i.ID)
	ms.forgetLoad(i.ID)
	ms.sched.RemoveWorker(i.ID)
	// A re-incarnation (same id, new epoch) departs the old one after the
	// new one may already have published events: the subscriber's epoch
	// signal resyncs the index then, so only a real departure drops the
	// worker from the index here.
	var cur workers.Info
	live := false
	if m := r.mem.Load(); m != nil {
		cur, live = m.Get(i.ID)
	}
	if !live || cur.Epoch == i.Epoch {
		ms.index.RemoveWorker(i.ID)
		if ms.pred != nil {
			ms.pred.RemoveWorker(i.ID)
		}
	}
	r.log.Info("worker departed", "worker", i.ID, "model", i.Model, "epoch", i.Epoch)
}

func (r *Replica) onLoad(l workers.LoadReport) {
	ms, ok := r.models[l.Model]
	if !ok {
		return
	}
	ms.recordLoad(l)
	ms.sched.ObserveLoad(scheduler.LoadReport{
		Key:             workerKeyOf(l.Worker, l.Rank),
		ActiveRequests:  l.ActiveRequests,
		WaitingRequests: l.WaitingRequests,
		KVUsedBlocks:    l.KVUsedBlocks,
		KVTotalBlocks:   l.KVTotalBlocks,
		PrefillTokens:   l.PrefillTokens,
		At:              l.At,
	})
}

// reportedStatus renders k's last load report for GET /v1/workers (nil
// before the first).
func (ms *modelState) reportedStatus(k workerref.Target) *api.ReportedLoad {
	l, ok := ms.reportedLoad(k)
	if !ok {
		return nil
	}
	out := &api.ReportedLoad{Running: l.ActiveRequests, Waiting: l.WaitingRequests, KVUsedBlocks: l.KVUsedBlocks,
		KVTotalBlocks: l.KVTotalBlocks, AgeMS: max(0, time.Since(l.At).Milliseconds())}
	if l.KVTotalBlocks > 0 {
		out.KVUsage = float64(l.KVUsedBlocks) / float64(l.KVTotalBlocks)
	}
	return out
}
