package telemetry

import (
	"context"
	"testing"

	"github.com/kvrouter/kvrouter/internal/buildinfo"
)

// Every /metrics built here (serve, gateway) carries kvr_build_info.
func TestPrometheusHasBuildInfo(t *testing.T) {
	p, err := NewPrometheus(false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	if err := buildinfo.Gathered(p.Registry); err != nil {
		t.Fatal(err)
	}
}
