package index

import (
	"testing"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind (readers
// and writers of the property test, NATS clients of the store tests).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoreNATSAsyncReply())
}
