package index

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind (readers
// and writers of the property test, NATS clients of the store tests).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
