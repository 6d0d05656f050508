package kvevents

import (
	"testing"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"go.uber.org/goleak"
)

// TestMain checks that no test leaves goroutines behind: publishers'
// senders and subscribers' consumers must stop on Close / ctx cancel.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoredGoroutines()...)
}
