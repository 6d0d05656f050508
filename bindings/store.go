package bindings

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// This file holds the raw JetStream operations under the commit protocol:
// the leader read, the conditional write that keeps a per-key TTL, the
// conditional purge, and the classification of their errors.

// JetStream error codes the protocol cares about.
const (
	codeWrongLastSeq      = 10071 // CAS conflict (R1, and often R3)
	codeWrongLastSeqConst = 10164 // CAS conflict while another write to the key is in flight (R3)
	codeNoMessage         = 10037 // MSG.GET: nothing stored under the subject
	codeNoPeers           = 10005 // too few cluster peers for the replicas asked for (cluster starting)
)

const (
	hdrKVOperation  = "KV-Operation"
	hdrMarkerReason = "Nats-Marker-Reason"
	hdrRollup       = "Nats-Rollup"
)

// readState is one read of a key: a usable binding, a malformed value, a
// tombstone (delete, purge or expiry marker) or nothing at all.
type readState struct {
	present  bool   // a value (usable or malformed) is stored
	rev      uint64 // revision of the value, or of the tombstone; 0 = nothing stored
	rec      record
	bad      error     // *MalformedValueError when the stored value is unusable
	storedAt time.Time // when this revision was stored (server clock, or the writer's send time for write-through)
	ttl      time.Duration
	leader   bool // read from the stream leader (not the cache)
}

// live reports whether a present entry's TTL has not yet run out at now.
func (s *readState) live(now time.Time) bool {
	return s.ttl <= 0 || now.Sub(s.storedAt) < s.ttl
}

// stateFromValue decodes a stored value into a readState.
func stateFromValue(key string, rev uint64, data []byte, storedAt time.Time) readState {
	st := readState{present: true, rev: rev, storedAt: storedAt}
	rec, err := decodeRecord(data)
	if err != nil {
		st.bad = &MalformedValueError{Key: key, Revision: rev, Err: err}
		return st
	}
	st.rec = rec
	st.ttl = rec.ttl()
	return st
}

// errAmbiguousWrite marks a write whose outcome is unknown: the request may
// or may not have been applied (timeout, lost connection, leader change).
type errAmbiguousWrite struct{ err error }

func (e *errAmbiguousWrite) Error() string { return "write outcome unknown: " + e.err.Error() }
func (e *errAmbiguousWrite) Unwrap() error { return e.err }

// classifyWrite maps a publish error to nil, ErrConflict (codes 10071 and
// 10164, or the KV client's mapped errors), a definite failure (any other
// API error: the server answered, so nothing was stored) or an ambiguous
// outcome (no answer).
func classifyWrite(err error) error {
	if err == nil {
		return nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		if apiErr.ErrorCode == codeWrongLastSeq || apiErr.ErrorCode == codeWrongLastSeqConst {
			return fmt.Errorf("%w: %w", ErrConflict, err)
		}
		return err
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return &errAmbiguousWrite{err: err}
}

func isAmbiguous(err error) bool {
	var a *errAmbiguousWrite
	return errors.As(err, &a)
}

// publishFunc is js.PublishMsg; tests replace it to inject faults.
type publishFunc func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)

// casWrite stores val under key if the key's last revision is expect (0:
// nothing stored), with the message TTL ttl, and returns the new revision.
// kv.Update would drop the per-key TTL, hence the raw publish.
func (t *Table) casWrite(ctx context.Context, key string, val []byte, expect uint64, ttl time.Duration) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err // not sent: a definite failure
	}
	t.st.writes.Add(1)
	m := &nats.Msg{Subject: t.kvPre + key, Data: val, Header: nats.Header{}}
	octx, cancel := context.WithTimeout(ctx, t.cfg.OpTimeout)
	pa, err := t.publish(octx, m, jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithMsgTTL(ttl))
	cancel()
	if err = classifyWrite(err); err != nil {
		return 0, err
	}
	return pa.Sequence, nil
}

// casPurge writes a purge marker (with a TTL, so the marker itself goes
// away) if the key's last revision is expect.
func (t *Table) casPurge(ctx context.Context, key string, expect uint64) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	t.st.writes.Add(1)
	m := &nats.Msg{Subject: t.kvPre + key, Header: nats.Header{}}
	m.Header.Set(hdrKVOperation, "PURGE")
	m.Header.Set(hdrRollup, "sub")
	octx, cancel := context.WithTimeout(ctx, t.cfg.OpTimeout)
	pa, err := t.publish(octx, m, jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithMsgTTL(t.cfg.MarkerTTL))
	cancel()
	if err = classifyWrite(err); err != nil {
		return 0, err
	}
	return pa.Sequence, nil
}

type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Subject string    `json:"subject"`
		Seq     uint64    `json:"seq"`
		Hdrs    []byte    `json:"hdrs,omitempty"`
		Data    []byte    `json:"data,omitempty"`
		Time    time.Time `json:"time"`
	} `json:"message,omitempty"`
}

// leaderReadOnce asks the stream leader (STREAM.MSG.GET, not a direct get,
// which any replica may answer stale) for the key's last message.
func (t *Table) leaderReadOnce(ctx context.Context, key string) (readState, error) {
	t.st.leaderReads.Add(1)
	req := make([]byte, 0, len(t.kvPre)+len(key)+20)
	req = append(req, `{"last_by_subj":"`...)
	req = append(req, t.kvPre...)
	req = append(req, key...)
	req = append(req, `"}`...)
	msg, err := t.nc.RequestWithContext(ctx, t.msgGetSubj, req)
	if err != nil {
		return readState{}, err
	}
	var resp msgGetResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return readState{}, fmt.Errorf("bindings: leader read of key %q: bad reply: %w", key, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == codeNoMessage {
			return readState{leader: true}, nil
		}
		return readState{}, fmt.Errorf("bindings: leader read of key %q: %w", key, resp.Error)
	}
	if resp.Message == nil {
		return readState{}, fmt.Errorf("bindings: leader read of key %q: empty reply", key)
	}
	m := resp.Message
	if len(m.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(m.Hdrs)
		if err != nil {
			return readState{}, fmt.Errorf("bindings: leader read of key %q: bad headers: %w", key, err)
		}
		if h.Get(hdrKVOperation) != "" || h.Get(hdrMarkerReason) != "" {
			return readState{rev: m.Seq, storedAt: m.Time, leader: true}, nil
		}
	}
	st := stateFromValue(key, m.Seq, m.Data, m.Time)
	st.leader = true
	return st, nil
}

// leaderRead retries leaderReadOnce until it gets an answer, ctx ends or
// budget passes. Around a leader change nobody answers for tens of
// milliseconds, so each try has a short timeout.
func (t *Table) leaderRead(ctx context.Context, key string, budget time.Duration) (readState, error) {
	deadline := time.Now().Add(budget)
	wait := 5 * time.Millisecond
	for {
		try := t.readTimeout
		if left := time.Until(deadline); left < try {
			try = left
		}
		rctx, cancel := context.WithTimeout(ctx, try)
		st, err := t.leaderReadOnce(rctx, key)
		cancel()
		if err == nil {
			t.cache.putRead(key, &st)
			return st, nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode != 0 && apiErr.Code != 503 {
			return readState{}, err // the server answered: retrying will not help
		}
		if ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return readState{}, fmt.Errorf("bindings: leader read of key %q: %w", key, err)
		}
		t.st.readRetries.Add(1)
		select {
		case <-ctx.Done():
			return readState{}, fmt.Errorf("bindings: leader read of key %q: %w", key, ctx.Err())
		case <-time.After(wait):
		}
		if wait < 200*time.Millisecond {
			wait *= 2
		}
	}
}
