package bindings

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// This file holds the quorum rule: what a replica reads is shown to be
// current by an operation the stream's majority must accept, never by the
// word of one server.
//
// Why: NATS's Raft has no read lease or read index. A stream leader cut off
// from its peers keeps answering STREAM.MSG.GET and STREAM.INFO from its own
// state for seconds after the majority has elected a new leader and
// accepted writes. So a leader read is followed by a confirm, and the
// cache's freshness probe is a mark, both of them writes:
//
//   - confirm(key, rev) writes to the quorum key with the headers
//     Nats-Expected-Last-Subject-Sequence: rev and
//     Nats-Expected-Last-Subject-Sequence-Subject: $KV.<bucket>.<key>.
//     The leader that accepts it checks, at proposal time, that key's last
//     revision is rev; the write then commits only if that leader still
//     holds a majority. An acknowledged confirm therefore shows that rev
//     was the key's latest committed revision at a moment between the read
//     and the answer: the read is linearizable. A deposed leader proposes
//     but cannot commit, so the confirm gets no answer in time, and the read
//     is retried (elsewhere, once the client's server learns the new
//     leader) or ends as ErrUnavailable. A mismatch (the key moved on, or a
//     write to it is in flight) re-reads.
//   - mark() writes to the quorum key without conditions and returns the
//     sequence the majority gave it: every write acknowledged before the
//     mark was sent has a lower sequence. That replaces STREAM.INFO's last
//     sequence, which a deposed leader would answer stale (the 5 s stale
//     Soft read of issue 25).
//
// The quorum key holds one message (History 1), has no dot (every binding
// key is "<model>.<session>", so none can be it), is skipped by the cache
// and counts as one entry beyond MaxSessions. On a stream with one replica
// there is no majority to lose: leader reads are not confirmed there.
//
// The one exception: a full bucket on a cluster. A DiscardNew stream at
// MaxMsgs refuses every write on R3, quorum writes too, before proposing
// them, so they prove nothing. A confirm refused so lets the leader's read
// stand (Stats.ConfirmsRefused counts it); while the bucket is full a
// Hard read is only the stream leader's word, as it was before confirms.
// Every write fails then anyway: new sessions are refused and renewals
// too (docs/protocol.md, "Limits").

// quorumKey is the bucket key of confirms and marks.
const quorumKey = "_quorum"

// confirm shows through the majority that key's latest revision is rev (0:
// nothing stored). nil: it was; an error matching ErrConflict: it was not
// (or another write to key was in flight); any other error: no proof.
func (t *Table) confirm(ctx context.Context, key string, rev uint64) error {
	t.st.confirms.Add(1)
	m := &nats.Msg{Subject: t.kvPre + quorumKey}
	// Through js, not t.publish: tests replace that to fault binding writes.
	_, err := t.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequenceForSubject(rev, t.kvPre+key))
	if err = t.asFull(classifyWrite(err)); err != nil {
		t.countUnconfirmed(err)
		return fmt.Errorf("confirm of revision %d: %w", rev, err)
	}
	return nil
}

// mark writes an unconditional quorum mark and returns its sequence.
func (t *Table) mark(ctx context.Context) (uint64, error) {
	m := &nats.Msg{Subject: t.kvPre + quorumKey}
	ack, err := t.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, fmt.Errorf("quorum mark in bucket %q: %w", t.cfg.Bucket, err)
	}
	return ack.Sequence, nil
}

// errUnconfirmed: a leader read whose confirm kept failing with a
// mismatch (the key kept changing) until the read's deadline.
var errUnconfirmed = errors.New("leader read not confirmed by the majority: the key kept changing")

// confirmCached confirms a cached revision directly: on a cluster a Hard
// read then costs one quorum write instead of a leader read and a confirm.
// false (the cache is behind, or no answer in time) sends the read to the
// leader.
func (t *Table) confirmCached(ctx context.Context, key string, rev uint64) bool {
	cctx, cancel := context.WithTimeout(ctx, t.readTimeout)
	defer cancel()
	return t.confirm(cctx, key, rev) == nil
}

// countUnconfirmed counts a confirm that failed, by why.
func (t *Table) countUnconfirmed(err error) {
	switch {
	case errors.Is(err, ErrFull):
		t.st.confirmsRefused.Add(1)
	case errors.Is(err, ErrConflict):
		t.st.confirmMismatches.Add(1)
	default:
		t.st.confirmLost.Add(1)
	}
}
