package api

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvrouter/kvrouter/workerref"
)

// Decision sync (DecisionsSubject): each replica publishes its routing
// decisions, (worker, rank, prompt sequence hashes), for its peers'
// predicted or approximate indexes (docs/protocol.md, "Decision sync").
// The body is a compact hand-written binary batch; the replica's side
// (batching, echoes, the bounded buffer) is router/host's peer sync.
//
// Wire format, version 1, little endian:
//
//	magic "KVRD" | version u8 (1) | flags u8 (0) | replica id len u16 | replica id
//	| count u16 | count × { worker len u16 | worker | rank u32 | hashes u32 | hashes × u64 }
//
// Sequence hashes are any ~uint64 type (kvevents.SeqHash in the replica),
// so this package needs no event package.
const (
	decisionMagic        = "KVRD"
	decisionVersion      = 1
	decisionHeaderFixed  = 4 + 1 + 1 + 2 + 2 // without the replica id
	decisionFixed        = 2 + 4 + 4         // per decision, without worker and hashes
	decisionCountOffset0 = 8                 // + replica id length: where count sits

	MaxDecisionsPerMsg  = 1024
	MaxDecisionHashes   = 1 << 14 // longer prompts share their first 16,384 blocks (a prefix is still exact)
	MaxDecisionMsgBytes = 256 << 10
)

// ErrBadDecisions reports an undecodable decision message.
var ErrBadDecisions = errors.New("bad decision message")

// Decision is one decoded routing decision; its hashes are
// DecisionBatch.Hashes(d).
type Decision struct {
	Key    workerref.Target
	off, n int
}

// DecisionBatch is a decoded message. It is reused across messages: the
// worker names are interned (bounded), the hashes share one buffer.
type DecisionBatch[H ~uint64] struct {
	Replica   []byte // the publishing replica's id; valid until the next decode
	Decisions []Decision
	hashes    []H
	names     map[string]string
}

// Hashes returns d's sequence hashes; valid until the next decode.
func (b *DecisionBatch[H]) Hashes(d Decision) []H { return b.hashes[d.off : d.off+d.n] }

// intern returns a string equal to p without allocating when seen before.
func (b *DecisionBatch[H]) intern(p []byte) string {
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

// AppendDecisionHeader starts a message from replica; its count is patched
// by SetDecisionCount.
func AppendDecisionHeader(dst []byte, replica string) []byte {
	dst = append(dst, decisionMagic...)
	dst = append(dst, decisionVersion, 0)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(replica)))
	dst = append(dst, replica...)
	return binary.LittleEndian.AppendUint16(dst, 0)
}

// SetDecisionCount writes the decision count into a message started with
// AppendDecisionHeader for a replica id of idLen bytes.
func SetDecisionCount(msg []byte, idLen, n int) {
	binary.LittleEndian.PutUint16(msg[decisionCountOffset0+idLen:], uint16(n))
}

// DecisionSize is the encoded size of one decision.
func DecisionSize(worker string, hashes int) int {
	return decisionFixed + len(worker) + 8*min(hashes, MaxDecisionHashes)
}

// AppendDecision appends one decision (hashes past MaxDecisionHashes cut).
func AppendDecision[H ~uint64](dst []byte, k workerref.Target, hashes []H) []byte {
	if len(hashes) > MaxDecisionHashes {
		hashes = hashes[:MaxDecisionHashes]
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

// DecodeDecisions parses a message into b (reset first). Every length is
// checked against the bounds and the bytes left; trailing bytes are an
// error. It never panics and, for a known worker name, does not allocate.
func DecodeDecisions[H ~uint64](data []byte, b *DecisionBatch[H]) error {
	b.Replica, b.Decisions, b.hashes = nil, b.Decisions[:0], b.hashes[:0]
	if len(data) < decisionHeaderFixed || string(data[:4]) != decisionMagic {
		return fmt.Errorf("%w: %d bytes, no %q header", ErrBadDecisions, len(data), decisionMagic)
	}
	if data[4] != decisionVersion {
		return fmt.Errorf("%w: version %d (want %d)", ErrBadDecisions, data[4], decisionVersion)
	}
	p := data[6:]
	idLen := int(binary.LittleEndian.Uint16(p))
	p = p[2:]
	if idLen == 0 || idLen > MaxWorkerIDLen || len(p) < idLen+2 {
		return fmt.Errorf("%w: replica id length %d with %d bytes left", ErrBadDecisions, idLen, len(p))
	}
	b.Replica = p[:idLen]
	p = p[idLen:]
	n := int(binary.LittleEndian.Uint16(p))
	p = p[2:]
	if n > MaxDecisionsPerMsg {
		return fmt.Errorf("%w: %d decisions (max %d)", ErrBadDecisions, n, MaxDecisionsPerMsg)
	}
	for i := 0; i < n; i++ {
		if len(p) < 2 {
			return fmt.Errorf("%w: decision %d truncated", ErrBadDecisions, i)
		}
		wl := int(binary.LittleEndian.Uint16(p))
		p = p[2:]
		if wl == 0 || wl > MaxWorkerIDLen || len(p) < wl+8 {
			return fmt.Errorf("%w: decision %d: worker length %d with %d bytes left", ErrBadDecisions, i, wl, len(p))
		}
		worker := p[:wl]
		p = p[wl:]
		rank := binary.LittleEndian.Uint32(p)
		nh := int(binary.LittleEndian.Uint32(p[4:]))
		p = p[8:]
		if nh > MaxDecisionHashes || len(p) < 8*nh {
			return fmt.Errorf("%w: decision %d: %d hashes with %d bytes left (max %d hashes)", ErrBadDecisions, i, nh, len(p), MaxDecisionHashes)
		}
		off := len(b.hashes)
		for j := 0; j < nh; j++ {
			b.hashes = append(b.hashes, H(binary.LittleEndian.Uint64(p[8*j:])))
		}
		p = p[8*nh:]
		b.Decisions = append(b.Decisions, Decision{Key: workerref.Target{Worker: b.intern(worker), Rank: rank}, off: off, n: nh})
	}
	if len(p) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadDecisions, len(p))
	}
	return nil
}
