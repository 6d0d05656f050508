package kvevents

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves goroutines behind: publishers'
// senders and subscribers' consumers must stop on Close / ctx cancel.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded nats-server's shutdown leaves these behind briefly.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
	)
}
