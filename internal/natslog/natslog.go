// Package natslog is the logger an in-process NATS server runs with while
// it starts: a server started with NoLog has no logger, so a fatal start-up
// error (a listen port already taken, JetStream that will not start) goes
// nowhere and shows only as a start-up that never finishes. FatalLog keeps
// that error, and WaitReady waits for the server and returns it.
//
// It owns nothing else; internal/natsconn (the embedded server of serve
// and demo) and internal/natstest (tests' servers) use it.
package natslog

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// FatalLog is a server.Logger that keeps the first Fatalf and drops every
// other line, as NoLog would. Safe for concurrent use.
type FatalLog struct {
	mu  sync.Mutex
	err error
}

var _ server.Logger = (*FatalLog)(nil)

// Fatalf keeps the first fatal error; the server's own Fatalf would exit
// the process, which an in-process server must not.
func (l *FatalLog) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = fmt.Errorf(format, v...)
	}
}

// Err returns the first fatal error reported, or nil.
func (l *FatalLog) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Of returns the first fatal error s reported, if it runs with a FatalLog.
func Of(s *server.Server) error {
	if l, ok := s.Logger().(*FatalLog); ok {
		return l.Err()
	}
	return nil
}

// ErrNotReady is WaitReady's error when the budget ran out without a fatal
// error.
var ErrNotReady = errors.New("not ready")

// WaitReady waits up to budget until s, started with a FatalLog, accepts
// connections. It returns s's fatal start-up error as soon as one is
// reported, which would otherwise cost the whole budget, and ErrNotReady
// when the budget runs out.
func WaitReady(s *server.Server, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	for !s.ReadyForConnections(100 * time.Millisecond) {
		if err := Of(s); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return ErrNotReady
		}
	}
	return nil
}

func (l *FatalLog) Noticef(string, ...any) {}
func (l *FatalLog) Warnf(string, ...any)   {}
func (l *FatalLog) Errorf(string, ...any)  {}
func (l *FatalLog) Debugf(string, ...any)  {}
func (l *FatalLog) Tracef(string, ...any)  {}
