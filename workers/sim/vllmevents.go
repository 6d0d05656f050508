package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

// This file is the engine's vLLM face for KV events: the emitters that turn
// one engine step's Stored/Removed/Cleared events into one vLLM
// KVEventBatch and publish it on the rank's ZMQ sockets, as a vLLM engine
// started with --kv-events-config does.

// ErrNoTokens: a Stored event reached a vLLM emitter through Emit, without
// the tokens BlockStored must carry (the engine uses EmitStored; Reannounce,
// which has no tokens, skips vLLM emitters). The event is dropped.
var ErrNoTokens = errors.New("sim: vLLM events need the stored blocks' tokens")

// VLLMEvents publishes an engine's events in vLLM's wire format: one
// vllmzmq.Publisher per data-parallel rank (rank r on the endpoints' port +
// r), one KVEventBatch per engine step that changed the cache, block hashes
// the engine's own (EngineHash), token ids included, medium "GPU".
type VLLMEvents struct {
	ranks []*vllmRank // nil when events are disabled
	enc   vllm.Encoding
	now   func() time.Time
}

// vllmRank is one rank's publisher and the epoch whose emitter may use it.
type vllmRank struct {
	mu    sync.Mutex
	pub   *vllmzmq.Publisher
	epoch uint64 // of the live emitter; 0 before the first
}

// NewVLLMEvents opens the sockets of ranks data-parallel ranks from cfg
// (vLLM's --kv-events-config). With events disabled (publisher "null", or
// enable_kv_cache_events false) it opens nothing and Factory yields
// DiscardEmitters. Events use vLLM's current encoding (map events, vLLM >=
// 0.24); SetEncoding picks the positional one. log nil discards.
func NewVLLMEvents(cfg vllmzmq.Config, ranks int, log *slog.Logger) (*VLLMEvents, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ranks < 1 {
		return nil, fmt.Errorf("%w: vLLM events for %d ranks", ErrBadConfig, ranks)
	}
	v := &VLLMEvents{enc: vllm.MapEvents, now: time.Now}
	if !cfg.Enabled() {
		return v, nil
	}
	for r := range ranks {
		p, err := vllmzmq.NewPublisher(cfg, r, log)
		if err != nil {
			v.Close()
			return nil, fmt.Errorf("sim: vLLM events rank %d: %w", r, err)
		}
		v.ranks = append(v.ranks, &vllmRank{pub: p})
	}
	return v, nil
}

// SetEncoding selects how events are written (before the engine starts).
func (v *VLLMEvents) SetEncoding(enc vllm.Encoding) { v.enc = enc }

// Enabled reports whether events are published.
func (v *VLLMEvents) Enabled() bool { return len(v.ranks) > 0 }

// Publisher returns rank's publisher (its endpoints, counters), or nil when
// events are disabled or there is no such rank.
func (v *VLLMEvents) Publisher(rank int) *vllmzmq.Publisher {
	if rank < 0 || rank >= len(v.ranks) {
		return nil
	}
	return v.ranks[rank].pub
}

// Factory returns the EmitterFactory for sim.Config.NewEmitter. The first
// emitter of a rank continues its publisher; each later one (Restart: a new
// engine process, as far as subscribers can tell) starts the seq over at 0
// with an empty replay buffer, and the previous emitter of that rank can no
// longer publish.
func (v *VLLMEvents) Factory() EmitterFactory {
	return func(rank uint32, epoch uint64) (EventEmitter, error) {
		if !v.Enabled() {
			return DiscardEmitter{}, nil
		}
		if int(rank) >= len(v.ranks) {
			return nil, fmt.Errorf("%w: rank %d, vLLM events opened for %d", ErrBadRank, rank, len(v.ranks))
		}
		vr := v.ranks[rank]
		vr.mu.Lock()
		defer vr.mu.Unlock()
		if vr.epoch != 0 && vr.epoch != epoch {
			vr.pub.Restart()
		}
		vr.epoch = epoch
		return &vllmEmitter{rank: vr, epoch: epoch, dpRank: int(rank), enc: vllm.Encoder{Encoding: v.enc}, now: v.now}, nil
	}
}

// Close closes every rank's sockets. Close the engine first (its last
// Cleared is published on the way out).
func (v *VLLMEvents) Close() error {
	var errs []error
	for _, r := range v.ranks {
		if err := r.pub.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// vllmEmitter is one rank's emitter for one epoch. The engine calls it under
// the rank's lock, so it needs no lock of its own; publishing takes the
// rank's, to tell a stale epoch's emitter from the live one.
type vllmEmitter struct {
	rank   *vllmRank
	epoch  uint64
	dpRank int
	enc    vllm.Encoder
	hashes []kvevents.EngineHash // scratch
	now    func() time.Time
	closed bool
}

// EmitStored encodes a Stored event with its tokens as one BlockStored.
func (e *vllmEmitter) EmitStored(ev kvevents.Event, tokens []uint32, keys BlockKeys) error {
	if ev.Kind != kvevents.KindStored {
		return e.Emit(ev)
	}
	e.hashes = e.hashes[:0]
	for _, b := range ev.Blocks {
		e.hashes = append(e.hashes, b.Engine)
	}
	// A local, not a field: the event is large and full of pointers, and
	// rewriting a heap copy per event costs write barriers.
	vev := vllm.Event{
		Kind: kvevents.KindStored, BlockHashes: e.hashes, Parent: ev.Parent, HasParent: ev.HasParent,
		TokenIDs: tokens, Medium: "GPU", LoraName: keys.LoRA, CacheSalt: keys.CacheSalt,
		LoraID: int64(keys.LoRAID), HasLoraID: keys.LoRAID != 0,
		// As vLLM >= 0.24 fills them for a full-attention model: one extra
		// keys entry per block (nil, or the adapter name and, on a
		// sequence's first block, the salt), KV cache group 0.
		HasExtraKeys: true, ExtraKeyCount: len(ev.Blocks), HasGroupIdx: true, SpecKind: "full_attention",
		Media: keys.Media,
	}
	if len(ev.Blocks) > 0 {
		vev.BlockSize = len(tokens) / len(ev.Blocks)
	}
	return e.enc.Add(&vev)
}

// Emit encodes Removed (one BlockRemoved per block, as vLLM's block pool
// emits them) and Cleared (AllBlocksCleared). Stored needs EmitStored.
func (e *vllmEmitter) Emit(ev kvevents.Event) error {
	switch ev.Kind {
	case kvevents.KindRemoved:
		e.hashes = append(e.hashes[:0], 0)
		vev := vllm.Event{Kind: kvevents.KindRemoved, BlockHashes: e.hashes, Medium: "GPU", HasGroupIdx: true}
		for _, h := range ev.Removed {
			e.hashes[0] = h
			if err := e.enc.Add(&vev); err != nil {
				return err
			}
		}
		return nil
	case kvevents.KindCleared:
		return e.enc.Add(&vllm.Event{Kind: kvevents.KindCleared})
	case kvevents.KindStored:
		return fmt.Errorf("%w: %d blocks dropped", ErrNoTokens, len(ev.Blocks))
	}
	return fmt.Errorf("sim: vLLM emitter: event kind %v", ev.Kind)
}

// EndStep publishes the step's events as one KVEventBatch; a step without
// events publishes nothing, as in vLLM.
func (e *vllmEmitter) EndStep() error {
	if e.enc.Len() == 0 {
		return nil
	}
	ts := float64(e.now().UnixNano()) / 1e9
	payload := e.enc.Finish(nil, ts, e.dpRank)
	e.rank.mu.Lock()
	defer e.rank.mu.Unlock()
	if e.closed || e.rank.epoch != e.epoch {
		return nil // a previous incarnation's last step: gone with it
	}
	_, err := e.rank.pub.Publish(payload)
	return err
}

// Close ends the emitter. What it had not published belonged to an
// incarnation that is over (Restart) or to an engine whose last Cleared
// was already published (Close), so it is dropped.
func (e *vllmEmitter) Close(context.Context) error {
	e.closed = true
	e.enc.Reset()
	return nil
}
