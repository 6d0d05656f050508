package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/zeebo/xxh3"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllm"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

// This file follows one data-parallel rank's event stream: sequence
// tracking, replay, resync, decode, convert, publish.

// Resync reasons (the label of kvr_bridge_resyncs_total).
const (
	reasonNoReplay     = "no_replay_socket"
	reasonReplayLate   = "replay_late"
	reasonReplayFailed = "replay_failed"
	reasonRestart      = "engine_restart"
	reasonUnreadable   = "unreadable_batch"
	// An event that did not decode, inside a readable batch, and does not
	// read as a BlockStored: it may have removed blocks.
	reasonBadEvent = "undecodable_event"
	// An event of a type the converter does not know, which it skips: it
	// too may have removed blocks.
	reasonUnknownEvent = "unknown_event"
)

// rank follows one rank: the only goroutine that touches its converter.
type rank struct {
	b      *Bridge
	id     uint32
	label  string // id as a metric label
	replay string // "" = no replay socket
	sub    *vllmzmq.Subscriber
	pub    *kvevents.Publisher
	conv   *vllm.Converter
	log    *slog.Logger

	synced   bool   // the first replay (or first live batch) has been handled
	expected uint64 // seq of the next batch to apply
	// overlap holds the payload hash of each batch applied from the last
	// replay that live messages may still repeat (the SUB queue received
	// them too); a lower seq that is not one of them is an engine restart.
	overlap map[uint64]uint64

	vb    vllm.Batch
	evs   []kvevents.Event
	one   []byte // salvage's single-event batch buffer
	conv0 vllm.ConverterConfig
}

// run catches up from the replay socket, then follows live messages until
// ctx ends or the subscriber is closed.
func (r *rank) run(ctx context.Context) error {
	if r.replay != "" {
		r.catchUp(ctx, 0, nil)
	}
	for {
		m, err := r.sub.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, vllmzmq.ErrClosed) {
				return nil
			}
			return fmt.Errorf("bridge: rank %d: %w", r.id, err)
		}
		r.handle(ctx, m)
	}
}

// handle places one live message in the sequence.
func (r *rank) handle(ctx context.Context, m vllmzmq.Message) {
	switch {
	case !r.synced:
		// No replay socket, or the first replay failed: what the engine
		// said before is unknown.
		reason := reasonNoReplay
		if r.replay != "" {
			reason = reasonReplayFailed
		}
		r.resync(reason)
		r.applyLive(m)
	case m.Seq == r.expected:
		r.overlap = nil // live has passed every replayed batch
		r.applyLive(m)
	case m.Seq > r.expected:
		r.b.met.gaps.WithLabelValues(r.label).Inc()
		r.log.Info("gap in the engine's event sequence", "expected", r.expected, "got", m.Seq)
		if r.replay == "" {
			r.resync(reasonNoReplay)
			r.applyLive(m)
			return
		}
		r.catchUp(ctx, r.expected, &m)
	default: // m.Seq < r.expected
		if h, ok := r.overlap[m.Seq]; ok && h == xxh3.Hash(m.Payload) {
			r.b.met.duplicates.WithLabelValues(r.label).Inc()
			return // already applied from the replay
		}
		r.log.Info("engine restarted: its sequence went down, its cache is empty", "expected", r.expected, "got", m.Seq)
		r.resync(reasonRestart)
		r.applyLive(m)
	}
}

// applyLive applies m and continues the sequence after it.
func (r *rank) applyLive(m vllmzmq.Message) {
	r.synced = true
	r.apply(m)
	r.expected = m.Seq + 1
}

// catchUp asks the replay socket for every batch from seq from and applies
// them; live, when set, is the message that revealed the gap. A late replay
// (the engine's buffer no longer holds from) or a failed one is a resync:
// routers clear the rank, then get what the engine still reports.
func (r *rank) catchUp(ctx context.Context, from uint64, live *vllmzmq.Message) {
	rctx, cancel := context.WithTimeout(ctx, r.b.cfg.ReplayTimeout)
	res, err := vllmzmq.Replay(rctx, r.replay, from)
	cancel()
	r.b.met.replays.WithLabelValues(r.label).Inc()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		r.log.Warn("replay failed: resyncing the rank", "from", from, "err", err)
		r.resync(reasonReplayFailed)
		if live != nil {
			r.applyLive(*live)
		}
		return
	}
	if res.Late {
		r.log.Warn("replay started after the seq asked for: the batches in between are lost, resyncing the rank",
			"from", from, "first", firstSeq(res))
		r.resync(reasonReplayLate)
	}
	r.synced = true
	r.overlap = make(map[uint64]uint64, len(res.Batches))
	for _, m := range res.Batches {
		r.apply(m)
		r.expected = m.Seq + 1
		r.overlap[m.Seq] = xxh3.Hash(m.Payload)
	}
	r.b.met.replayed.WithLabelValues(r.label).Add(float64(len(res.Batches)))
	if live != nil && live.Seq >= r.expected {
		// The engine moved on past what the replay returned (it answered
		// before publishing live): what lies between is lost.
		if live.Seq > r.expected {
			r.resync(reasonReplayLate)
		}
		r.applyLive(*live)
	}
}

func firstSeq(res vllmzmq.ReplayResult) string {
	if len(res.Batches) == 0 {
		return "none"
	}
	return strconv.FormatUint(res.Batches[0].Seq, 10)
}

// resync tells routers to drop the rank (KindCleared): they never keep a
// block the engine may have dropped while its events were lost. After an
// engine restart the converter forgets its engine-hash table too (the new
// process's cache is empty). Otherwise it keeps it: an engine hash names
// the same content for the engine's life, so a later child of a block
// stored before the loss still gets its true sequence hashes, and routers
// learn it although its parent, still cached but never announced again,
// stays unknown to them until the engine stores it anew. A sequence-keyed
// converter is told (RoutersCleared): its counts of what routers hold
// restart from zero, or a block whose removal was lost would count as
// held and its next store never be announced.
func (r *rank) resync(reason string) {
	r.b.met.resyncs.WithLabelValues(r.label, reason).Inc()
	if reason == reasonRestart {
		r.conv, _ = vllm.NewConverter(r.conv0) // the config was checked at start
		r.b.adapters.restarted()
	} else {
		r.conv.RoutersCleared()
	}
	r.emit(kvevents.Event{Kind: kvevents.KindCleared})
}

// apply decodes, converts and publishes one batch. A payload that does not
// decode as a whole is re-read event by event (salvage); if even that
// fails nothing of it can be trusted, and since a removal may be among the
// lost events the rank is resynced. So it is at the place of each single
// event that does not decode, unless it still reads as a BlockStored (its
// loss only under-counts): routers then keep only what the events after
// it store, never a block it may have removed.
func (r *rank) apply(m vllmzmq.Message) {
	r.b.met.batches.WithLabelValues(r.label).Inc()
	err := vllm.DecodeBatch(m.Payload, &r.vb)
	if err == nil {
		r.convert()
		return
	}
	r.b.met.decodeErrors.WithLabelValues(decodeCause(err)).Inc()
	r.log.Warn("undecodable event batch", "seq", m.Seq, "err", err)
	bad, serr := salvage(m.Payload, &r.one, func(single, event []byte) bool {
		if vllm.DecodeBatch(single, &r.vb) == nil {
			r.convert()
			return true
		}
		if !onlyStores(event) {
			r.log.Warn("undecodable event that may have removed blocks: resyncing the rank", "seq", m.Seq)
			r.resync(reasonBadEvent)
		}
		return false
	})
	r.b.met.badEvents.Add(float64(bad))
	if serr != nil {
		r.log.Warn("event batch unreadable: resyncing the rank", "seq", m.Seq, "err", serr)
		r.resync(reasonUnreadable)
	}
}

// convert converts r.vb and publishes its events. The converter skips an
// event of a type it does not know (Kind 0), which may have removed
// blocks: the batch is converted in runs that each end at such an event,
// and the rank is resynced after each of them.
func (r *rank) convert() {
	r.b.adapters.noteBatch(&r.vb)
	all := r.vb.Events
	from := 0
	for i := range all {
		if all[i].Kind != 0 {
			continue
		}
		r.convertRun(all[from : i+1]) // with it, so that the converter counts it
		r.log.Warn("unknown vLLM event type: resyncing the rank", "type", all[i].Tag)
		r.resync(reasonUnknownEvent)
		from = i + 1
	}
	if from < len(all) || from == 0 {
		r.convertRun(all[from:])
	}
	r.vb.Events = all
}

// convertRun converts the events evs of r.vb and publishes them.
func (r *rank) convertRun(evs []vllm.Event) {
	r.vb.Events = evs
	var err error
	r.evs, err = r.conv.Convert(&r.vb, r.evs[:0])
	if err != nil {
		r.b.met.convertErrors.WithLabelValues(convertCause(err)).Inc()
		r.log.Debug("vLLM events skipped", "err", err)
	}
	for i := range r.evs {
		r.emit(r.evs[i])
	}
}

func (r *rank) emit(ev kvevents.Event) {
	if err := r.pub.Emit(ev); err != nil {
		r.b.met.publishRejected.WithLabelValues(r.label).Inc()
		r.log.Warn("event not published", "err", err)
		return
	}
	r.b.met.blocks.WithLabelValues(r.label).Add(float64(len(ev.Blocks) + len(ev.Removed) + len(ev.RemovedSeqs)))
}

func decodeCause(err error) string {
	switch {
	case errors.Is(err, kvevents.ErrTruncated):
		return "truncated"
	case errors.Is(err, kvevents.ErrOversized):
		return "oversized"
	default:
		return "malformed"
	}
}

func convertCause(err error) string {
	switch {
	case errors.Is(err, vllm.ErrUnknownParent):
		return "unknown_parent"
	case errors.Is(err, vllm.ErrBlockSizeMismatch):
		return "block_size"
	case errors.Is(err, vllm.ErrTokenCount):
		return "token_count"
	case errors.Is(err, vllm.ErrBadMedia):
		return "bad_media"
	default:
		return "other"
	}
}
