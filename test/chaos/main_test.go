package chaos

import (
	"testing"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoredGoroutines()...)
}
