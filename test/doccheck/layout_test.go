package doccheck

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kvrouter/kvrouter/"

// forbidden is the import rule of the house (README, "Layout"; the
// architecture's "must not import" column): a package whose path starts with
// the key may not import, directly, a package whose path starts with any of
// the prefixes. "internal/" may import nothing of kvrouter outside internal/,
// which is checked separately.
var forbidden = map[string][]string{
	"kvevents":         {module + "router", module + "bindings", module + "workers", module + "gateway"},
	"router/api":       {"github.com/nats-io/nats-server", "go.opentelemetry.io/otel/sdk", "github.com/prometheus/"},
	"router/index":     {module + "bindings"},
	"router/scheduler": {"github.com/nats-io/", module + "bindings"},
	"bindings":         {module + "router", module + "workers"},
	"workers":          {module + "router/host", module + "router/scheduler", module + "bindings"},
	// The endpoint picker parses, tokenizes and routes only through the
	// gateway package: no second copy of the route path.
	"epp":       {module + "router/host", module + "router/scheduler", module + "router/index", module + "bindings", module + "workers"},
	"workerref": {module},
	"session":   {module},
}

// TestImportsPointDown lists every package's non-test imports with go list
// and fails on an import the layout forbids: the check the README's layout
// section describes (`go list -deps ./internal/...`).
func TestImportsPointDown(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		pkg := strings.TrimPrefix(f[0], module)
		for _, imp := range f[1:] {
			if bad := forbiddenImport(pkg, imp); bad != "" {
				t.Errorf("%s imports %s: %s", pkg, imp, bad)
			}
		}
	}
}

// forbiddenImport says why pkg may not import imp, or "" when it may.
func forbiddenImport(pkg, imp string) string {
	if strings.HasPrefix(pkg, "internal/") && strings.HasPrefix(imp, module) && !strings.HasPrefix(imp, module+"internal/") {
		return "internal/ holds leaves only: it imports nothing of kvrouter outside internal/"
	}
	for owner, prefixes := range forbidden {
		if pkg != owner && !strings.HasPrefix(pkg, owner+"/") {
			continue
		}
		for _, p := range prefixes {
			if strings.HasPrefix(imp, p) && !strings.HasPrefix(imp, module+owner) {
				return owner + " must not import " + p
			}
		}
	}
	if strings.HasPrefix(imp, module+"test/") {
		return "nothing imports the suites under test/"
	}
	return ""
}

func TestForbiddenImportRule(t *testing.T) {
	for _, c := range []struct {
		pkg, imp string
		bad      bool
	}{
		{"internal/jskv", module + "internal/escape", false},
		{"internal/chaos", module + "router/host", true},
		{"kvevents", module + "workerref", false},
		{"kvevents/vllmzmq", module + "workers", true},
		{"router/scheduler", "github.com/nats-io/nats.go", true},
		{"router/host", module + "bindings", false},
		{"bindings", module + "router/api", true},
		{"cmd/kvrouter", module + "test/chaos", true},
		{"workerref", module + "kvevents", true},
		{"session", module + "bindings", true},
	} {
		if got := forbiddenImport(c.pkg, c.imp) != ""; got != c.bad {
			t.Errorf("forbiddenImport(%s, %s) = %v, want %v", c.pkg, c.imp, got, c.bad)
		}
	}
}
