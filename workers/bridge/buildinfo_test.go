package bridge

import (
	"testing"

	"github.com/kvrouter/kvrouter/internal/buildinfo"
)

// The bridge's /metrics carries kvr_build_info.
func TestMetricsHaveBuildInfo(t *testing.T) {
	if err := buildinfo.Gathered(newMetrics(false).reg); err != nil {
		t.Fatal(err)
	}
}
