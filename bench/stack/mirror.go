package stack

import (
	"context"
	"sync"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// Mirror holds an exact copy of every worker's cached sequence hashes, fed
// synchronously by the engines' emitters. It implements replay.CacheProbe.
type Mirror struct {
	mu      sync.RWMutex
	workers map[workerref.Target]*cacheCopy
}

type cacheCopy struct {
	seqs   map[kvevents.SeqHash]struct{}
	engine map[kvevents.EngineHash]kvevents.SeqHash
}

// NewMirror returns an empty mirror.
func NewMirror() *Mirror { return &Mirror{workers: map[workerref.Target]*cacheCopy{}} }

func (m *Mirror) apply(k workerref.Target, ev *kvevents.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.workers[k]
	if c == nil {
		c = &cacheCopy{seqs: map[kvevents.SeqHash]struct{}{}, engine: map[kvevents.EngineHash]kvevents.SeqHash{}}
		m.workers[k] = c
	}
	switch ev.Kind {
	case kvevents.KindStored:
		for _, b := range ev.Blocks {
			c.seqs[b.Seq] = struct{}{}
			c.engine[b.Engine] = b.Seq
		}
	case kvevents.KindRemoved:
		for _, e := range ev.Removed {
			if s, ok := c.engine[e]; ok {
				delete(c.seqs, s)
				delete(c.engine, e)
			}
		}
		for _, s := range ev.RemovedSeqs { // a sequence-keyed emitter
			delete(c.seqs, s)
		}
	case kvevents.KindCleared:
		clear(c.seqs)
		clear(c.engine)
	}
}

// CachedPrefix sets out[worker] to the number of leading hashes the worker
// (any of its ranks) holds now.
func (m *Mirror) CachedPrefix(hashes []kvevents.SeqHash, out map[string]int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for k, c := range m.workers {
		n := 0
		for n < len(hashes) {
			if _, ok := c.seqs[hashes[n]]; !ok {
				break
			}
			n++
		}
		if n > out[k.Worker] {
			out[k.Worker] = n
		}
	}
}

// Blocks is the number of blocks mirrored for a worker rank.
func (m *Mirror) Blocks(k workerref.Target) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if c := m.workers[k]; c != nil {
		return len(c.seqs)
	}
	return 0
}

// emitter applies each event to the mirror, then hands it to the next
// emitter (the publisher; nil when events are off).
type emitter struct {
	m    *Mirror
	key  workerref.Target
	next sim.EventEmitter
}

func (e *emitter) Emit(ev kvevents.Event) error {
	if e.m != nil {
		e.m.apply(e.key, &ev)
	}
	if e.next == nil {
		return nil
	}
	return e.next.Emit(ev)
}

// Close closes the next emitter when it can be closed (the engine calls it
// when an incarnation ends).
func (e *emitter) Close(ctx context.Context) error {
	if c, ok := e.next.(interface{ Close(context.Context) error }); ok {
		return c.Close(ctx)
	}
	return nil
}
