package doccheck

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoreNATSAsyncReply())
}

// repoRoot is the repository root, two directories above this package.
const repoRoot = "../.."

// readDoc returns the text of a file relative to the repository root.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatalf("read %s: %v", rel, err)
	}
	return string(b)
}
