package kvevents

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

// EnsureStream creates the event stream, or updates an existing one to cfg
// (idempotent: every worker and router may call it at start).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	sc := cfg.JetStreamConfig()
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("kvevents: ensure stream %q: %w", sc.Name, err)
	}
	return s, nil
}
