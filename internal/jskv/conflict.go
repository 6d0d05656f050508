package jskv

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrConflict: a conditional write lost. The concrete error is a
// *ConflictError.
var ErrConflict = errors.New("jskv: compare-and-set conflict")

// ConflictError is a lost compare-and-set. Its text is the server's (or
// the KV client's) error unchanged: it classifies, callers describe.
type ConflictError struct {
	Code jetstream.ErrorCode // 10071 or 10164; 0 for the KV client's mapped errors
	Err  error
}

func (e *ConflictError) Error() string { return e.Err.Error() }

// Unwrap matches ErrConflict and the underlying error (a
// *jetstream.APIError for raw publishes).
func (e *ConflictError) Unwrap() []error { return []error{ErrConflict, e.Err} }

// AsConflict maps a write error carrying API code 10071 (wrong last
// sequence) or 10164 (the same, on a replicated stream while another write
// to the subject is in flight), or the KV client's ErrKeyExists /
// ErrKeyRevisionMismatch, to a *ConflictError. Raw publishes are not mapped
// by nats.go, hence this. Other errors, and nil, are returned unchanged.
func AsConflict(err error) error {
	if err == nil {
		return nil
	}
	var ce *ConflictError
	if errors.As(err, &ce) {
		return err
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		if apiErr.ErrorCode == CodeWrongLastSeq || apiErr.ErrorCode == CodeWrongLastSeqConst {
			return &ConflictError{Code: apiErr.ErrorCode, Err: err}
		}
		return err
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return &ConflictError{Err: err}
	}
	return err
}

// Publisher is the part of jetstream.JetStream that Publish needs; tests
// put a PublishFunc in front of it to inject faults.
type Publisher interface {
	PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// PublishFunc adapts a function to Publisher.
type PublishFunc func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)

// PublishMsg calls f.
func (f PublishFunc) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return f(ctx, m, opts...)
}

// Publish stores m (subject "$KV.<bucket>.<key>", data, headers) if the
// subject's last sequence is expect (0: nothing stored), with the message
// TTL ttl, and returns the new revision. kv.Update cannot be used: it
// drops the key's TTL. A lost compare-and-set is a *ConflictError; any
// other error is returned as the publisher gave it.
func Publish(ctx context.Context, p Publisher, m *nats.Msg, expect uint64, ttl time.Duration) (uint64, error) {
	pa, err := p.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithMsgTTL(ttl))
	if err != nil {
		return 0, AsConflict(err)
	}
	return pa.Sequence, nil
}
