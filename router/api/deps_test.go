package api

import (
	"os/exec"
	"strings"
	"testing"
)

// The wire-contract package is what a client binary links: no NATS server,
// no OpenTelemetry SDK, no Prometheus, no router internals.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/nats-io/nats-server/",
		"go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters/",
		"github.com/prometheus/",
		"github.com/kvrouter/kvrouter/router/host",
		"github.com/kvrouter/kvrouter/router/scheduler",
		"github.com/kvrouter/kvrouter/router/index",
		"github.com/kvrouter/kvrouter/bindings",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %v", deps)
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == strings.TrimSuffix(f, "/") || strings.HasPrefix(d, f) {
				t.Errorf("router/api depends on %s (forbidden prefix %s)", d, f)
			}
		}
	}
}
