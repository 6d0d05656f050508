package host

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
)

// Decision sharing. The predicted index (and, in approximate mode, the
// approximate index) is fed by routing decisions; a replica only makes its
// own, so with several replicas each would know only its share of the
// fleet's recent decisions and sibling requests split over replicas would
// scatter. Each replica therefore publishes every decision's (worker, rank,
// prompt sequence hashes) on <prefix>.decisions.<model> and records its
// peers' decisions into its own predicted/approximate index. Messages are a
// compact hand-written binary batch (docs/protocol.md), a replica
// drops its own echoes by the Kvr-Replica header (and the replica id in the
// message), and the outgoing buffer is bounded: when full, decisions are
// dropped and counted, never waited for on the route path.

// Wire format, version 1, little endian:
//
//	magic "KVRD" | version u8 (1) | flags u8 (0) | replica id len u16 | replica id
//	| count u16 | count × { worker len u16 | worker | rank u32 | hashes u32 | hashes × u64 }
const (
	decisionMagic        = "KVRD"
	decisionVersion      = 1
	decisionHeaderFixed  = 4 + 1 + 1 + 2 + 2 // without the replica id
	decisionFixed        = 2 + 4 + 4         // per decision, without worker and hashes
	maxDecisionsPerMsg   = 1024
	maxDecisionHashes    = 1 << 14 // longer prompts share their first 16,384 blocks (a prefix is still exact)
	maxDecisionMsgBytes  = 256 << 10
	decisionCountOffset0 = 8 // + replica id length: where count sits
)

// ErrBadDecisions reports an undecodable decision message.
var ErrBadDecisions = errors.New("host: bad decision message")

// decision is one decoded routing decision; its hashes are
// decisionBatch.hashes[off:off+n].
type decision struct {
	key    workerref.Target
	off, n int
}

// decisionBatch is a decoded message. It is reused across messages: the
// worker names are interned (bounded), the hashes share one buffer.
type decisionBatch struct {
	replica   []byte
	decisions []decision
	hashes    []kvevents.SeqHash
	names     map[string]string
}

func (b *decisionBatch) hashesOf(d decision) []kvevents.SeqHash { return b.hashes[d.off : d.off+d.n] }

// intern returns a string equal to p without allocating when seen before.
func (b *decisionBatch) intern(p []byte) string {
	if s, ok := b.names[string(p)]; ok {
		return s
	}
	if b.names == nil || len(b.names) >= 1<<14 {
		b.names = make(map[string]string)
	}
	s := string(p)
	b.names[s] = s
	return s
}

// appendDecisionHeader starts a message from replica; its count is patched
// by setDecisionCount.
func appendDecisionHeader(dst []byte, replica string) []byte {
	dst = append(dst, decisionMagic...)
	dst = append(dst, decisionVersion, 0)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(replica)))
	dst = append(dst, replica...)
	return binary.LittleEndian.AppendUint16(dst, 0)
}

// setDecisionCount writes the decision count into a message started with
// appendDecisionHeader for a replica id of idLen bytes.
func setDecisionCount(msg []byte, idLen, n int) {
	binary.LittleEndian.PutUint16(msg[decisionCountOffset0+idLen:], uint16(n))
}

// decisionSize is the encoded size of one decision.
func decisionSize(worker string, hashes int) int {
	return decisionFixed + len(worker) + 8*min(hashes, maxDecisionHashes)
}

// appendDecision appends one decision (hashes past maxDecisionHashes cut).
func appendDecision(dst []byte, k workerref.Target, hashes []kvevents.SeqHash) []byte {
	if len(hashes) > maxDecisionHashes {
		hashes = hashes[:maxDecisionHashes]
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(k.Worker)))
	dst = append(dst, k.Worker...)
	dst = binary.LittleEndian.AppendUint32(dst, k.Rank)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(hashes)))
	for _, h := range hashes {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(h))
	}
	return dst
}

// decodeDecisions parses a message into b (reset first). Every length is
// checked against the bounds and the bytes left; trailing bytes are an
// error. It never panics and, for a known worker name, does not allocate.
func decodeDecisions(data []byte, b *decisionBatch) error {
	b.replica, b.decisions, b.hashes = nil, b.decisions[:0], b.hashes[:0]
	if len(data) < decisionHeaderFixed || string(data[:4]) != decisionMagic {
		return fmt.Errorf("%w: %d bytes, no %q header", ErrBadDecisions, len(data), decisionMagic)
	}
	if data[4] != decisionVersion {
		return fmt.Errorf("%w: version %d (want %d)", ErrBadDecisions, data[4], decisionVersion)
	}
	p := data[6:]
	idLen := int(binary.LittleEndian.Uint16(p))
	p = p[2:]
	if idLen == 0 || idLen > api.MaxWorkerIDLen || len(p) < idLen+2 {
		return fmt.Errorf("%w: replica id length %d with %d bytes left", ErrBadDecisions, idLen, len(p))
	}
	b.replica = p[:idLen]
	p = p[idLen:]
	n := int(binary.LittleEndian.Uint16(p))
	p = p[2:]
	if n > maxDecisionsPerMsg {
		return fmt.Errorf("%w: %d decisions (max %d)", ErrBadDecisions, n, maxDecisionsPerMsg)
	}
	for i := 0; i < n; i++ {
		if len(p) < 2 {
			return fmt.Errorf("%w: decision %d truncated", ErrBadDecisions, i)
		}
		wl := int(binary.LittleEndian.Uint16(p))
		p = p[2:]
		if wl == 0 || wl > api.MaxWorkerIDLen || len(p) < wl+8 {
			return fmt.Errorf("%w: decision %d: worker length %d with %d bytes left", ErrBadDecisions, i, wl, len(p))
		}
		worker := p[:wl]
		p = p[wl:]
		rank := binary.LittleEndian.Uint32(p)
		nh := int(binary.LittleEndian.Uint32(p[4:]))
		p = p[8:]
		if nh > maxDecisionHashes || len(p) < 8*nh {
			return fmt.Errorf("%w: decision %d: %d hashes with %d bytes left (max %d hashes)", ErrBadDecisions, i, nh, len(p), maxDecisionHashes)
		}
		off := len(b.hashes)
		for j := 0; j < nh; j++ {
			b.hashes = append(b.hashes, kvevents.SeqHash(binary.LittleEndian.Uint64(p[8*j:])))
		}
		p = p[8*nh:]
		b.decisions = append(b.decisions, decision{key: workerref.Target{Worker: b.intern(worker), Rank: rank}, off: off, n: nh})
	}
	if len(p) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadDecisions, len(p))
	}
	return nil
}

// decisionOut is a decision waiting to be published; hashes is pooled.
type decisionOut struct {
	key    workerref.Target
	hashes *[]kvevents.SeqHash
}

// shareDecision queues a local decision for the peers; it never blocks.
func (r *Replica) shareDecision(ms *modelState, k workerref.Target, hashes []kvevents.SeqHash) {
	if ms.decisions == nil || len(hashes) == 0 {
		return
	}
	hp := hashPool.Get().(*[]kvevents.SeqHash)
	*hp = append((*hp)[:0], hashes[:min(len(hashes), maxDecisionHashes)]...)
	select {
	case ms.decisions <- decisionOut{key: k, hashes: hp}:
	default:
		hashPool.Put(hp)
		if ms.decDropped.Add(1)&1023 == 1 {
			r.log.Warn("decision sync buffer full: decisions dropped (peers' predicted indexes miss them)",
				"model", ms.name, "dropped", ms.decDropped.Load())
		}
	}
}

func (r *Replica) startDecisionSync() error {
	for _, name := range r.modelList {
		ms := r.models[name]
		if ms.decisions == nil {
			continue
		}
		var b decisionBatch // reused: the handler runs on one goroutine
		if err := r.subscribeSync(api.DecisionsSubject(r.cfg.Prefix, name), func(m *nats.Msg) { r.onRemoteDecisions(ms, m, &b) }); err != nil {
			return fmt.Errorf("host: decision sync of %q: %w", name, err)
		}
		r.bg.Add(1)
		go r.publishDecisions(ms)
	}
	return nil
}

func (r *Replica) onRemoteDecisions(ms *modelState, m *nats.Msg, b *decisionBatch) {
	if r.ownEcho(m) {
		return
	}
	if err := decodeDecisions(m.Data, b); err != nil {
		ms.decBad.Add(1)
		r.m.decisionSync.Add(context.Background(), 1, attr(attribute.String("direction", "bad")))
		r.log.Debug("bad decision message", "model", ms.name, "err", err)
		return
	}
	if string(b.replica) == r.id {
		return // own echo without the header
	}
	now := time.Now()
	for _, d := range b.decisions {
		ms.pred.Record(d.key, b.hashesOf(d), now)
	}
	ms.decApplied.Add(uint64(len(b.decisions)))
	r.m.decisionSync.Add(context.Background(), int64(len(b.decisions)), attr(attribute.String("direction", "applied")))
}

// publishDecisions batches the model's decisions (for at most
// BookingSyncInterval, up to maxDecisionsPerMsg or maxDecisionMsgBytes per
// message) and publishes them until the replica stops, then flushes.
func (r *Replica) publishDecisions(ms *modelState) {
	defer r.bg.Done()
	subject := api.DecisionsSubject(r.cfg.Prefix, ms.name)
	hdr := nats.Header{api.HeaderReplica: []string{r.id}}
	sentOpt := attr(attribute.String("direction", "sent"))
	limit := maxDecisionMsgBytes
	if mp := int(r.nc.MaxPayload()); mp > 0 && mp < limit {
		limit = mp
	}
	buf := appendDecisionHeader(nil, r.id)
	head := len(buf)
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		setDecisionCount(buf, len(r.id), n)
		if err := r.nc.PublishMsg(&nats.Msg{Subject: subject, Header: hdr, Data: buf}); err != nil {
			r.log.Debug("decision sync publish failed", "err", err)
		} else {
			r.m.decisionSync.Add(context.Background(), int64(n), sentOpt)
		}
		buf, n = buf[:head], 0
	}
	// add reports a full message: maxDecisionsPerMsg decisions.
	add := func(d decisionOut) bool {
		if len(buf)+decisionSize(d.key.Worker, len(*d.hashes)) > limit {
			flush()
		}
		if len(buf)+decisionSize(d.key.Worker, len(*d.hashes)) <= limit {
			buf = appendDecision(buf, d.key, *d.hashes)
			n++
		} else {
			ms.decDropped.Add(1) // larger than a message on its own
		}
		if cap(*d.hashes) <= 1<<16 {
			hashPool.Put(d.hashes)
		}
		return n >= maxDecisionsPerMsg
	}
	runBatches(r.stop, ms.decisions, r.cfg.BookingSyncInterval, add, flush)
}
