package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestResolve(t *testing.T) {
	vcs := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	cases := []struct {
		name            string
		version, commit string
		read            func() (*debug.BuildInfo, bool)
		wantV, wantC    string
	}{
		{"link-time values win", "v1.2.3", "def456", vcs, "v1.2.3", "def456"},
		{"toolchain stamp fills the gaps", "", "", vcs, "devel", "abc123-dirty"},
		{"nothing recorded", "", "", none, Unknown, Unknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := resolve(c.version, c.commit, c.read)
			if in.Version != c.wantV || in.Commit != c.wantC {
				t.Fatalf("resolve = %s/%s, want %s/%s", in.Version, in.Commit, c.wantV, c.wantC)
			}
			if s := in.String(); !strings.Contains(s, c.wantV) || !strings.Contains(s, c.wantC) || !strings.Contains(s, in.GoVersion) {
				t.Fatalf("String() = %q lacks the version, commit or Go version", s)
			}
		})
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := Gathered(reg); err == nil {
		t.Fatal("Gathered found kvr_build_info in an empty registry")
	}
	reg.MustRegister(Collector())
	if err := Gathered(reg); err != nil {
		t.Fatal(err)
	}
	// A second registry takes its own copy.
	prometheus.NewRegistry().MustRegister(Collector())
}
