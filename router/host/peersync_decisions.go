package host

import (
	"context"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
)

// Decision sync, one of peerSync's two streams. The predicted index (and,
// in approximate mode, the approximate index) is fed by routing decisions;
// a replica only makes its own, so with several replicas each would know
// only its share of the fleet's recent decisions and sibling requests
// split over replicas would scatter. Each replica therefore publishes
// every decision's (worker, rank, prompt sequence hashes) on
// <prefix>.decisions.<model> and records its peers' decisions into its own
// predicted/approximate index. Messages are router/api's binary decision
// batch ("KVRD", api.AppendDecision, api.DecodeDecisions), a replica drops
// its own echoes by the Kvr-Replica header (and the replica id in the
// message), and the outgoing buffer is bounded: when full, decisions are
// dropped and counted, never waited for on the route path.

// decisionOut is a decision waiting to be published; hashes is pooled.
type decisionOut struct {
	key    workerref.Target
	hashes *[]kvevents.SeqHash
}

// shareDecision queues a local decision for the peers; it never blocks.
func (p *peerSync) shareDecision(ms *modelState, k workerref.Target, hashes []kvevents.SeqHash) {
	if ms.peers.decisions == nil || len(hashes) == 0 {
		return
	}
	hp := hashPool.Get().(*[]kvevents.SeqHash)
	*hp = append((*hp)[:0], hashes[:min(len(hashes), api.MaxDecisionHashes)]...)
	if !ms.peers.decisions.put(decisionOut{key: k, hashes: hp}) {
		hashPool.Put(hp)
		if ms.peers.decDropped.Add(1)&1023 == 1 {
			p.log.Warn("decision sync buffer full: decisions dropped (peers' predicted indexes miss them)",
				"model", ms.name, "dropped", ms.peers.decDropped.Load())
		}
	}
}

// startDecisions subscribes to the peers' decisions of ms and starts
// publishing its own.
func (p *peerSync) startDecisions(ms *modelState) error {
	var b api.DecisionBatch[kvevents.SeqHash] // reused: the handler runs on one goroutine
	if err := p.subscribe(api.DecisionsSubject(p.prefix, ms.name), func(m *nats.Msg) { p.onRemoteDecisions(ms, m, &b) }); err != nil {
		return fmt.Errorf("host: decision sync of %q: %w", ms.name, err)
	}
	p.bg.run(func(stop <-chan struct{}) { p.publishDecisions(ms, stop) })
	return nil
}

func (p *peerSync) onRemoteDecisions(ms *modelState, m *nats.Msg, b *api.DecisionBatch[kvevents.SeqHash]) {
	if p.ownEcho(m) {
		return
	}
	if err := api.DecodeDecisions(m.Data, b); err != nil {
		ms.peers.decBad.Add(1)
		p.m.decisionSync.Add(context.Background(), 1, attr(attribute.String("direction", "bad")))
		p.log.Debug("bad decision message", "model", ms.name, "err", err)
		return
	}
	if string(b.Replica) == p.id {
		return // own echo without the header
	}
	now := time.Now()
	for _, d := range b.Decisions {
		ms.pred.Record(d.Key, b.Hashes(d), now)
	}
	ms.peers.decApplied.Add(uint64(len(b.Decisions)))
	p.m.decisionSync.Add(context.Background(), int64(len(b.Decisions)), attr(attribute.String("direction", "applied")))
}

// publishDecisions batches the model's decisions (for at most
// BookingSyncInterval, up to api.MaxDecisionsPerMsg or
// api.MaxDecisionMsgBytes per message) and publishes them until stop
// closes, then flushes.
func (p *peerSync) publishDecisions(ms *modelState, stop <-chan struct{}) {
	subject := api.DecisionsSubject(p.prefix, ms.name)
	hdr := nats.Header{api.HeaderReplica: []string{p.id}}
	sentOpt := attr(attribute.String("direction", "sent"))
	limit := api.MaxDecisionMsgBytes
	if mp := int(p.nc.MaxPayload()); mp > 0 && mp < limit {
		limit = mp
	}
	buf := api.AppendDecisionHeader(nil, p.id)
	head := len(buf)
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		api.SetDecisionCount(buf, len(p.id), n)
		if err := p.nc.PublishMsg(&nats.Msg{Subject: subject, Header: hdr, Data: buf}); err != nil {
			p.log.Debug("decision sync publish failed", "err", err)
		} else {
			p.m.decisionSync.Add(context.Background(), int64(n), sentOpt)
		}
		buf, n = buf[:head], 0
	}
	// add reports a full message: api.MaxDecisionsPerMsg decisions.
	add := func(d decisionOut) bool {
		if len(buf)+api.DecisionSize(d.key.Worker, len(*d.hashes)) > limit {
			flush()
		}
		if len(buf)+api.DecisionSize(d.key.Worker, len(*d.hashes)) <= limit {
			buf = api.AppendDecision(buf, d.key, *d.hashes)
			n++
		} else {
			ms.peers.decDropped.Add(1) // larger than a message on its own
		}
		if cap(*d.hashes) <= 1<<16 {
			hashPool.Put(d.hashes)
		}
		return n >= api.MaxDecisionsPerMsg
	}
	runBatches(stop, ms.peers.decisions, p.every, add, flush)
}
