package jskv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Limits are the configuration fields of a stream (an event stream, or the
// stream under a KV bucket or object store) that its owner sets and
// verifies. Zero MaxBytes or MaxAge is unlimited; Replicas below 1 is 1.
type Limits struct {
	Replicas int
	MaxBytes int64
	MaxAge   time.Duration
}

// Reconcile compares the existing stream behind info with its owner's
// limits and acts as owner says: report each difference, or update the
// stream (everything but the limits kept as it is) and report what
// changed. A nil owner does nothing: only owners verify. kind and name
// say what the stream is to the user ("bucket", "kvr-bindings").
func Reconcile(ctx context.Context, js jetstream.JetStream, kind, name string, info *jetstream.StreamInfo, want Limits, owner *Owner) error {
	if owner == nil || info == nil {
		return nil
	}
	have := info.Config
	diff := Compare(kind, name,
		Field{"replicas", max(1, have.Replicas), max(1, want.Replicas)},
		Field{"max_bytes", LimitOf(have.MaxBytes), LimitOf(want.MaxBytes)},
		Field{"max_age", max(0, have.MaxAge), max(0, want.MaxAge)},
	)
	if len(diff) == 0 {
		return nil
	}
	if owner.Update {
		cfg := have
		cfg.Replicas, cfg.MaxBytes, cfg.MaxAge = max(1, want.Replicas), LimitOf(want.MaxBytes), max(0, want.MaxAge)
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("update %s %q (stream %s) to replicas %d, max_bytes %d, max_age %v: %w",
				kind, name, have.Name, cfg.Replicas, cfg.MaxBytes, cfg.MaxAge, err)
		}
	}
	owner.report(diff)
	return nil
}

// AwaitCreated calls open until it returns an error that is not notFound,
// polling with backoff (50 ms doubling to 1 s) until ctx ends; then it
// returns the last error joined with ctx's. Each call gets at most
// attemptTimeout: an API request whose reply is lost (a cluster electing
// its meta leader) is tried again rather than using up the whole wait. It
// creates nothing: it is how a process that only uses a stream or bucket
// waits for its owner to create it.
func AwaitCreated[T any](ctx context.Context, open func(context.Context) (T, error), notFound error) (T, error) {
	return retryWhile(ctx, attemptTimeout, open, func(err error) bool { return errors.Is(err, notFound) }, "waited until")
}

// attemptTimeout bounds one look-up of AwaitCreated.
const attemptTimeout = 2 * time.Second

// callTimeout bounds one call of Call (an R3 create takes well under a
// second on a healthy cluster).
const callTimeout = 5 * time.Second

// CreateWaitingForPeers is Call for a create on a cluster that may still be
// starting: while the server answers code 10005 (too few peers online for
// the replicas asked for) it waits with backoff (50 ms doubling to 1 s)
// and tries again, until ctx ends.
func CreateWaitingForPeers[T any](ctx context.Context, create func(context.Context) (T, error)) (T, error) {
	noPeers := func(err error) bool {
		var apiErr *jetstream.APIError
		return errors.As(err, &apiErr) && apiErr.ErrorCode == CodeNoPeers
	}
	return retryWhile(ctx, callTimeout, create, noPeers, "waited for peers until")
}

// Call runs one JetStream API call with at most callTimeout for each try,
// trying again while its reply is lost (a cluster electing its meta
// leader answers nothing) and ctx allows, instead of letting one lost
// reply use up the whole of ctx. Use it for calls that are safe to repeat
// (look-ups, creates that report "already exists").
func Call[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	return callWithin(ctx, callTimeout, call)
}

// callWithin is Call with each try bounded by try.
func callWithin[T any](ctx context.Context, try time.Duration, call func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, try)
		v, err := call(actx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return v, err
		}
	}
}

// retryWhile calls call (each try bounded by try, lost replies tried
// again) until its error no longer satisfies again, waiting with backoff
// (50 ms doubling to 1 s) between calls until ctx ends; then the last
// error is returned joined with ctx's, prefixed by waited.
func retryWhile[T any](ctx context.Context, try time.Duration, call func(context.Context) (T, error), again func(error) bool, waited string) (T, error) {
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		v, err := callWithin(ctx, try, call)
		if !again(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("%w (%s: %w)", err, waited, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// WaitBucket binds to the existing bucket, waiting (bounded by ctx) while
// it does not exist yet; it never creates or changes one. The error of a
// bucket that did not appear matches jetstream.ErrBucketNotFound.
func WaitBucket(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	kv, err := AwaitCreated(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.KeyValue(ctx, bucket)
	}, jetstream.ErrBucketNotFound)
	if err != nil {
		return nil, fmt.Errorf("bucket %q: %w", bucket, err)
	}
	return kv, nil
}
