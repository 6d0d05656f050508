package bindings

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/jskv"
)

// This file holds the raw JetStream operations under the commit protocol:
// the leader read, the conditional write that keeps a per-key TTL, the
// conditional purge, and the classification of their errors.

const (
	hdrKVOperation = "KV-Operation"
	hdrRollup      = "Nats-Rollup"
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

// unavailable wraps err, the failure of an operation on key that got no
// answer, as an *UnavailableError, unless the caller gave up (ctx
// cancelled): then it is only that.
func unavailable(ctx context.Context, op, key string, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("bindings: %s of key %q: %w", op, key, ctx.Err())
	}
	return &UnavailableError{Op: op, Key: key, Err: err}
}

// errAmbiguousWrite marks a write whose outcome is unknown: the request may
// or may not have been applied (timeout, lost connection, leader change).
type errAmbiguousWrite struct{ err error }

func (e *errAmbiguousWrite) Error() string { return "write outcome unknown: " + e.err.Error() }
func (e *errAmbiguousWrite) Unwrap() error { return e.err }

// classifyWrite maps a publish error to nil, ErrConflict (codes 10071 and
// 10164, or the KV client's mapped errors: jskv.AsConflict; the result also
// matches jskv.ErrConflict), a definite failure (any other API error: the
// server answered, so nothing was stored) or an ambiguous outcome (no
// answer).
func classifyWrite(err error) error {
	if err == nil {
		return nil
	}
	if err = jskv.AsConflict(err); errors.Is(err, jskv.ErrConflict) {
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return err
	}
	return &errAmbiguousWrite{err: err}
}

func isAmbiguous(err error) bool {
	var a *errAmbiguousWrite
	return errors.As(err, &a)
}

// Descriptions of the server's code 10077 (storing failed) when a
// DiscardNew stream is at a limit (nats-server's ErrMaxMsgs, ErrMaxBytes).
const (
	codeStoreFailed    jetstream.ErrorCode = 10077
	descMaxMsgsFailed                      = "maximum messages exceeded"
	descMaxBytesFailed                     = "maximum bytes exceeded"
)

// asFull maps the server's refusal of a write past MaxSessions or MaxBytes
// to a *FullError; other errors are returned unchanged.
func (t *Table) asFull(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != codeStoreFailed {
		return err
	}
	switch {
	case strings.Contains(apiErr.Description, descMaxMsgsFailed):
		return &FullError{Bucket: t.cfg.Bucket, Sessions: t.cfg.MaxSessions, Err: err}
	case strings.Contains(apiErr.Description, descMaxBytesFailed):
		return &FullError{Bucket: t.cfg.Bucket, Bytes: t.cfg.MaxBytes, Err: err}
	}
	return err
}

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
	rev, err := jskv.Publish(octx, t.publish, m, expect, ttl)
	cancel()
	if err = t.asFull(classifyWrite(err)); err != nil {
		return 0, err
	}
	return rev, nil
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
	rev, err := jskv.Publish(octx, t.publish, m, expect, t.cfg.MarkerTTL)
	cancel()
	if err = t.asFull(classifyWrite(err)); err != nil {
		return 0, err
	}
	return rev, nil
}

// leaderReadOnce asks the stream leader for the key's last message:
// STREAM.MSG.GET, not a direct get, which any replica may answer stale.
// The one exception is a one-replica stream: its only server answers a
// direct get at half the cost (no API queue, no JSON), and an answer
// that names the stream is the leader's. Anything else it answers (an
// absence, which a mirror may give, or an error) goes to STREAM.MSG.GET.
func (t *Table) leaderReadOnce(ctx context.Context, key string) (readState, error) {
	t.st.leaderReads.Add(1)
	if t.directGetPre != "" {
		if m, err := jskv.DirectLastMsg(ctx, t.nc, t.directGetPre, t.stream, t.kvPre+key); err == nil {
			return leaderState(key, &m), nil
		}
		t.st.directFallbacks.Add(1)
	}
	m, err := jskv.LastMsg(ctx, t.nc, t.msgGetSubj, t.kvPre+key)
	switch {
	case errors.Is(err, jskv.ErrNoMessage):
		return readState{leader: true}, nil
	case err != nil:
		return readState{}, err // leaderRead names the key
	}
	return leaderState(key, &m), nil
}

// leaderState is the read state of key's last message m, read from the
// leader.
func leaderState(key string, m *jskv.Msg) readState {
	if m.Tombstone() {
		return readState{rev: m.Seq, storedAt: m.Time, leader: true}
	}
	st := stateFromValue(key, m.Seq, m.Data, m.Time)
	st.leader = true
	return st
}

// directGetPrefix is Table.directGetPre for a stream of replicas.
func directGetPrefix(replicas int, cfg Config) string {
	if replicas != 1 {
		return ""
	}
	return jskv.DirectGetPrefix(cfg.APIPrefix, cfg.Bucket)
}

// leaderRead retries leaderReadOnce until it gets an answer the majority
// confirms (quorum.go; a one-replica stream needs no confirm), ctx ends or
// ResolveTimeout passes. Around a leader change nobody answers for tens of
// milliseconds, so each try has a short timeout; a leader cut off from its
// peers answers reads but cannot commit the confirm, so its answers are
// never used. No confirmed answer in time is an *UnavailableError.
func (t *Table) leaderRead(ctx context.Context, key string) (readState, error) {
	deadline := time.Now().Add(t.cfg.ResolveTimeout)
	wait := 5 * time.Millisecond
	for {
		st, err := t.leaderReadTry(ctx, key, deadline)
		if err == nil {
			t.cache.putRead(key, &st)
			return st, nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode != 0 && apiErr.Code != 503 && !errors.Is(err, ErrConflict) {
			// The server answered: retrying will not help.
			return readState{}, fmt.Errorf("bindings: leader read of key %q: %w", key, err)
		}
		if ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return readState{}, unavailable(ctx, "leader read", key, err)
		}
		t.st.readRetries.Add(1)
		select {
		case <-ctx.Done():
			return readState{}, unavailable(ctx, "leader read", key, ctx.Err())
		case <-time.After(wait):
		}
		if wait < 200*time.Millisecond {
			wait *= 2
		}
	}
}

// leaderReadTry is one leader read and its confirm, each bounded by the
// read timeout and the deadline.
func (t *Table) leaderReadTry(ctx context.Context, key string, deadline time.Time) (readState, error) {
	try := min(t.readTimeout, time.Until(deadline))
	rctx, cancel := context.WithTimeout(ctx, try)
	defer cancel()
	st, err := t.leaderReadOnce(rctx, key)
	if err != nil || !t.confirmReads {
		return st, err
	}
	cctx, ccancel := context.WithTimeout(ctx, min(t.readTimeout, time.Until(deadline)))
	defer ccancel()
	switch err := t.confirm(cctx, key, st.rev); {
	case err == nil:
		return st, nil
	case errors.Is(err, ErrFull):
		return st, nil // see quorum.go: no proof to be had
	case errors.Is(err, ErrConflict):
		return readState{}, fmt.Errorf("%w: %w", errUnconfirmed, err)
	default:
		return readState{}, err
	}
}
