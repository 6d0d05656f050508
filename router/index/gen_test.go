package index

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// universe is a random prefix tree of blocks: a node's sequence hash names
// the path from its root, like real sequence hashes.
type universe struct {
	parent []int
	seq    []kvevents.SeqHash
}

func newUniverse(rng *rand.Rand, n, roots int) *universe {
	u := &universe{}
	for i := 0; i < n; i++ {
		p := -1
		if i >= roots {
			switch r := rng.IntN(10); {
			case r < 6:
				p = i - 1 // extend the latest chain: long conversations
			case r < 8:
				p = rng.IntN(roots) // branch off a system prompt
			default:
				p = rng.IntN(i)
			}
		}
		var prev uint64
		if p >= 0 {
			prev = uint64(u.seq[p])
		}
		u.parent = append(u.parent, p)
		u.seq = append(u.seq, kvevents.SeqHash(mix(prev^uint64(i)*0x9e3779b97f4a7c15+1)))
	}
	return u
}

// path returns node ids from the root to n, at most maxLen (the deepest).
func (u *universe) path(n, maxLen int) []int {
	var p []int
	for ; n >= 0; n = u.parent[n] {
		p = append(p, n)
	}
	for i, j := 0, len(p)-1; i < j; i, j = i+1, j-1 {
		p[i], p[j] = p[j], p[i]
	}
	if len(p) > maxLen {
		p = p[:maxLen]
	}
	return p
}

func (u *universe) hashes(path []int) []kvevents.SeqHash {
	out := make([]kvevents.SeqHash, len(path))
	for i, n := range path {
		out[i] = u.seq[n]
	}
	return out
}

type opKind int

const (
	opBatch opKind = iota
	opClear
	opResync
	opRemoveWorker
	opLoad
)

type op struct {
	kind   opKind
	batch  *kvevents.Batch
	key    workerref.Target
	blocks []kvevents.StoredBlock
}

func (o *op) applyIndex(x *Index, seq uint64) {
	switch o.kind {
	case opBatch:
		x.ApplyBatch(seq, o.batch)
	case opClear:
		x.ClearWorker(o.key)
	case opResync:
		x.Resync(kvevents.Signal{Kind: kvevents.SignalGap, Worker: o.key.Worker, Rank: o.key.Rank})
	case opRemoveWorker:
		x.RemoveWorker(o.key.Worker)
	case opLoad:
		x.LoadWorker(o.key, o.blocks)
	}
}

func (o *op) applyRef(r *refModel) {
	switch o.kind {
	case opBatch:
		r.apply(o.batch)
	case opClear, opResync:
		r.clearKey(o.key)
	case opRemoveWorker:
		r.removeWorker(o.key.Worker)
	case opLoad:
		r.load(o.key, o.blocks)
	}
}

// gen draws random operations over a universe and a set of workers.
type gen struct {
	rng   *rand.Rand
	u     *universe
	names []string
	ranks int
	salt  map[string]uint64 // workers whose engine ids are not content hashes
	model string
	// seqKeyed: workers whose batches are sequence-keyed (one in three
	// when withSeqKeyed); one batch in 40 of any worker uses the other
	// keying, as a bridge restarted with the other setting would.
	seqKeyed map[string]bool
}

func newGen(rng *rand.Rand, u *universe, names []string, ranks int) *gen {
	g := &gen{rng: rng, u: u, names: names, ranks: ranks, salt: map[string]uint64{}}
	for _, n := range names {
		if rng.IntN(4) == 0 {
			g.salt[n] = rng.Uint64() | 1
		}
	}
	return g
}

// withSeqKeyed makes about a third of g's workers sequence-keyed, or
// every one of them when all is set (the block tables are then roomy,
// except while a batch of the other keying has made one engine-keyed).
func (g *gen) withSeqKeyed(all ...bool) *gen {
	g.seqKeyed = map[string]bool{}
	for _, n := range g.names {
		if g.rng.IntN(3) == 0 || len(all) > 0 && all[0] {
			g.seqKeyed[n] = true
		}
	}
	return g
}

func workerNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

func (g *gen) engine(k workerref.Target, node int) kvevents.EngineHash {
	return kvevents.EngineHash(mix(uint64(node)*31 + 7 + g.salt[k.Worker]))
}

func (g *gen) key() workerref.Target {
	return workerref.Target{Worker: g.names[g.rng.IntN(len(g.names))], Rank: uint32(g.rng.IntN(g.ranks))}
}

// storeEvent stores a stretch of a random path for k.
func (g *gen) storeEvent(k workerref.Target) kvevents.Event {
	n := g.rng.IntN(len(g.u.seq))
	p := g.u.path(n, 48)
	start := 0
	if g.rng.IntN(3) == 0 {
		start = g.rng.IntN(len(p))
	}
	ev := kvevents.Event{Kind: kvevents.KindStored}
	if start > 0 {
		ev.HasParent = true
		ev.Parent = g.engine(k, p[start-1])
	}
	for _, node := range p[start:] {
		blk := kvevents.StoredBlock{Engine: g.engine(k, node), Seq: g.u.seq[node]}
		switch g.rng.IntN(50) {
		case 0: // a second engine id for the same content
			blk.Engine = kvevents.EngineHash(g.rng.Uint64())
		case 1: // an engine id reused for other content
			blk.Seq = g.u.seq[g.rng.IntN(len(g.u.seq))]
		case 2: // zero is an ordinary engine hash
			blk.Engine = 0
		}
		ev.Blocks = append(ev.Blocks, blk)
	}
	return ev
}

// removeEvent removes some of what k holds (per ref) plus unknown ids.
func (g *gen) removeEvent(k workerref.Target, ref *refModel) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.KindRemoved}
	// Sorted, so that a seed always yields the same operations.
	held := slices.Sorted(maps.Keys(ref.workers[k]))
	want := 1 + g.rng.IntN(24)
	for _, e := range held {
		if len(ev.Removed) >= want {
			break
		}
		if g.rng.IntN(2) == 0 {
			ev.Removed = append(ev.Removed, e)
		}
	}
	if g.rng.IntN(4) == 0 {
		ev.Removed = append(ev.Removed, kvevents.EngineHash(g.rng.Uint64()))
	}
	return ev
}

func (g *gen) batch(k workerref.Target, ref *refModel) *kvevents.Batch {
	b := &kvevents.Batch{Model: g.model, Worker: k.Worker, Rank: k.Rank, Epoch: 1}
	if g.seqKeyed != nil {
		b.SeqKeyed = g.seqKeyed[k.Worker] != (g.rng.IntN(40) == 0)
	}
	defer func() {
		if b.SeqKeyed {
			seqKey(b)
		}
	}()
	for n := 1 + g.rng.IntN(3); n > 0; n-- {
		var ev kvevents.Event
		switch r := g.rng.IntN(100); {
		case r < 62:
			ev = g.storeEvent(k)
		case r < 94:
			ev = g.removeEvent(k, ref)
		case r < 95:
			ev = kvevents.Event{Kind: kvevents.KindCleared}
		case r < 96: // a clear naming another tier still clears everything
			ev = kvevents.Event{Kind: kvevents.KindCleared, Tier: kvevents.TierDisk}
		default: // another tier: must be ignored
			ev = g.storeEvent(k)
			ev.Tier = kvevents.TierHost
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

// seqKey rewrites b's events as a sequence-keyed publisher sends them:
// blocks named by sequence hash only, removals as sequence hashes (the
// reference keeps a sequence-keyed worker's blocks under their sequence
// hash as engine hash, so removeEvent's picks are sequence hashes).
func seqKey(b *kvevents.Batch) {
	for i := range b.Events {
		ev := &b.Events[i]
		ev.Parent, ev.HasParent = 0, false
		for j := range ev.Blocks {
			ev.Blocks[j].Engine = 0
		}
		for _, e := range ev.Removed {
			ev.RemovedSeqs = append(ev.RemovedSeqs, kvevents.SeqHash(e))
		}
		ev.Removed = nil
	}
}

func (g *gen) op(ref *refModel) op {
	k := g.key()
	switch r := g.rng.IntN(1000); {
	case r < 955:
		return op{kind: opBatch, batch: g.batch(k, ref)}
	case r < 967:
		return op{kind: opClear, key: k}
	case r < 979:
		return op{kind: opResync, key: k}
	case r < 989:
		return op{kind: opRemoveWorker, key: k}
	default:
		ev := g.storeEvent(k)
		return op{kind: opLoad, key: k, blocks: ev.Blocks}
	}
}

// query draws a lookup: a path, sometimes extended with unknown blocks or
// broken in the middle.
func (g *gen) query() []kvevents.SeqHash {
	n := g.rng.IntN(len(g.u.seq))
	h := g.u.hashes(g.u.path(n, 64))
	switch g.rng.IntN(6) {
	case 0:
		for i := g.rng.IntN(8); i > 0; i-- {
			h = append(h, kvevents.SeqHash(g.rng.Uint64()))
		}
	case 1:
		if len(h) > 2 {
			h[1+g.rng.IntN(len(h)-1)] = kvevents.SeqHash(g.rng.Uint64())
		}
	case 2:
		h = h[:g.rng.IntN(len(h)+1)]
	}
	return h
}

func (g *gen) options() LookupOptions {
	var opt LookupOptions
	opt.EarlyExit = g.rng.IntN(3) == 0
	if g.rng.IntN(3) == 0 {
		mod := uint32(2 + g.rng.IntN(3))
		opt.Allowed = func(k workerref.Target) bool {
			return (uint32(len(k.Worker))+uint32(k.Worker[len(k.Worker)-1])+k.Rank)%mod != 0
		}
	}
	return opt
}
