package kvevents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/jskv"
)

// Stream defaults.
const (
	DefaultMaxAge     = time.Hour
	DefaultDuplicates = 2 * time.Minute
)

// StreamConfig describes the JetStream stream that stores event batches.
type StreamConfig struct {
	Name       string        // default DefaultStream ("KVR_EVENTS")
	Prefix     string        // subjects <Prefix>.events.>; default DefaultPrefix
	MaxAge     time.Duration // how long batches are kept for replay; default 1h
	Duplicates time.Duration // Nats-Msg-Id dedup window; default 2m
	Replicas   int           // default 1
	MaxBytes   int64         // 0 = unlimited
	// Storage defaults to jetstream.FileStorage (its zero value).
	Storage jetstream.StorageType
}

// JetStreamConfig returns the jetstream.StreamConfig EnsureStream applies,
// with defaults filled in.
func (c StreamConfig) JetStreamConfig() jetstream.StreamConfig {
	if c.Name == "" {
		c.Name = DefaultStream
	}
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.Duplicates <= 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.Duplicates > c.MaxAge {
		c.Duplicates = c.MaxAge // the server rejects a window longer than MaxAge
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	maxBytes := c.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        c.Name,
		Description: "kvrouter KV-cache event batches (kvevents wire format v1)",
		Subjects:    []string{EventSubjectFilter(c.Prefix)},
		Storage:     c.Storage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.MaxAge,
		MaxBytes:    maxBytes,
		Duplicates:  c.Duplicates,
		Replicas:    c.Replicas,
	}
}

// EnsureStream creates the event stream, or updates an existing one to cfg.
// It is for tests and single-process tools that own everything they use;
// the router replica sets the stream up with SetUpStream, and processes that
// only publish or read (workers, bridges) look it up with LookupStream, so
// that none of them downgrades what the replica configured.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	sc := cfg.JetStreamConfig()
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("kvevents: ensure stream %q: %w", sc.Name, err)
	}
	return s, nil
}

// ErrStreamMissing: the event stream does not exist (LookupStream waited
// for it in vain). The concrete error is a *StreamMissingError.
var ErrStreamMissing = errors.New("kvevents: event stream not found")

// StreamMissingError names the stream LookupStream waited for, and who
// creates it.
type StreamMissingError struct {
	Stream string
	Err    error // the last look-up's error, with the end of the wait
}

func (e *StreamMissingError) Error() string {
	return "event stream " + e.Stream + " not found: start kvrouter serve first (the router replica creates it), " +
		"or check --event-stream and the NATS account: " + e.Err.Error()
}

// Unwrap matches ErrStreamMissing and the look-up's error.
func (e *StreamMissingError) Unwrap() []error { return []error{ErrStreamMissing, e.Err} }

// SetUpStream is the stream owner's (the router replica's) set-up: create
// the stream with cfg when it is missing (CreateStream: a concurrent
// creator is fine), else verify the existing one against cfg's replicas,
// MaxBytes, MaxAge and subjects and, as owner says, report each difference
// or update the limits (jskv.Reconcile). Nothing else is ever changed.
func SetUpStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, owner jskv.Owner) (jetstream.Stream, error) {
	sc := cfg.JetStreamConfig()
	// Each call bounded and tried again if its reply is lost (jskv.Call).
	lookup := func(c context.Context) (jetstream.Stream, error) { return js.Stream(c, sc.Name) }
	s, err := jskv.Call(ctx, lookup)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = jskv.CreateWaitingForPeers(ctx, func(c context.Context) (jetstream.Stream, error) { return js.CreateStream(c, sc) })
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = jskv.Call(ctx, lookup) // another replica (or our lost try) created it first
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kvevents: set up stream %q: %w", sc.Name, err)
	}
	info := s.CachedInfo()
	subjects := jskv.Compare("stream", sc.Name, jskv.Field{Name: "subjects",
		Have: strings.Join(info.Config.Subjects, ","), Want: strings.Join(sc.Subjects, ",")})
	for _, m := range subjects {
		if owner.Report != nil {
			owner.Report(m) // events outside the stream's subjects are not stored: worth a warning, not an update
		}
	}
	want := jskv.Limits{Replicas: sc.Replicas, MaxBytes: sc.MaxBytes, MaxAge: sc.MaxAge}
	if err := jskv.Reconcile(ctx, js, "stream", sc.Name, info, want, &owner); err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	return s, nil
}

// LookupStream returns the existing event stream, waiting (bounded by ctx)
// while it does not exist yet. It never creates or changes the stream: it
// is what workers and bridges call, so that the replica's configuration
// (replicas, limits) is the only one. A stream that did not appear is a
// *StreamMissingError (ErrStreamMissing), with a hint at who creates it.
func LookupStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	if name == "" {
		name = DefaultStream
	}
	s, err := jskv.AwaitCreated(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		return js.Stream(ctx, name)
	}, jetstream.ErrStreamNotFound)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, &StreamMissingError{Stream: name, Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("kvevents: look up stream %q: %w", name, err)
	}
	return s, nil
}
