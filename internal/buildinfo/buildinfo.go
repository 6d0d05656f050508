package buildinfo

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Version and Commit are set at link time:
//
//	go build -ldflags "-X github.com/kvrouter/kvrouter/internal/buildinfo.Version=v0.4.0 \
//	  -X github.com/kvrouter/kvrouter/internal/buildinfo.Commit=$(git rev-parse HEAD)" ./cmd/kvrouter
//
// Left empty, Get falls back to what the Go toolchain recorded.
var (
	Version string
	Commit  string
)

// Unknown stands for a version or commit that nothing recorded (a `go run`
// or a build with -buildvcs=false and no -ldflags).
const Unknown = "unknown"

// Info is one build's identity.
type Info struct {
	Version   string // release, e.g. v0.4.0; "devel" or Unknown for a local build
	Commit    string // full commit hash, "-dirty" appended for a modified tree
	GoVersion string // e.g. go1.26.8
	Platform  string // GOOS/GOARCH
}

var get = sync.OnceValue(func() Info { return resolve(Version, Commit, debug.ReadBuildInfo) })

// Get returns this binary's build identity.
func Get() Info { return get() }

// resolve prefers the link-time values and fills the gaps from the build
// info the toolchain embeds (module version for `go install m@v`, the vcs.*
// settings for a build inside a git checkout).
func resolve(version, commit string, read func() (*debug.BuildInfo, bool)) Info {
	in := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := read(); ok {
		if in.Version == "" && bi.Main.Version != "" {
			in.Version = strings.Trim(bi.Main.Version, "()") // "(devel)" for a build inside the checkout
		}
		if in.Commit == "" {
			in.Commit = vcsCommit(bi.Settings)
		}
	}
	if in.Version == "" {
		in.Version = Unknown
	}
	if in.Commit == "" {
		in.Commit = Unknown
	}
	return in
}

func vcsCommit(settings []debug.BuildSetting) string {
	var rev string
	var dirty bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}

// String is the line `kvrouter --version` prints.
func (in Info) String() string {
	return fmt.Sprintf("kvrouter %s (commit %s, %s, %s)", in.Version, in.Commit, in.GoVersion, in.Platform)
}

// LogAttrs are the build's attributes for the start-up log line.
func (in Info) LogAttrs() []any {
	return []any{slog.String("version", in.Version), slog.String("commit", in.Commit), slog.String("go", in.GoVersion)}
}

// Collector is the kvr_build_info gauge: 1, labelled with this build's
// version, commit and Go version, the Prometheus convention for joining a
// build's identity onto any series. A new one each call, so that every
// registry can hold its own.
func Collector() prometheus.Collector {
	in := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "kvr_build_info",
		Help:        "1, labelled with the kvrouter build: release version, commit and Go version.",
		ConstLabels: prometheus.Labels{"version": in.Version, "commit": in.Commit, "goversion": in.GoVersion},
	})
	g.Set(1)
	return g
}

// Gathered checks that g serves kvr_build_info = 1 with this build's
// labels: the test every /metrics registry's owner runs.
func Gathered(g prometheus.Gatherer) error {
	mfs, err := g.Gather()
	if err != nil {
		return fmt.Errorf("buildinfo: gather: %w", err)
	}
	in := Get()
	want := map[string]string{"version": in.Version, "commit": in.Commit, "goversion": in.GoVersion}
	for _, mf := range mfs {
		if mf.GetName() != "kvr_build_info" {
			continue
		}
		if len(mf.GetMetric()) != 1 {
			return fmt.Errorf("buildinfo: %d kvr_build_info series, want 1", len(mf.GetMetric()))
		}
		m := mf.GetMetric()[0]
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || m.GetGauge().GetValue() != 1 {
			return fmt.Errorf("buildinfo: kvr_build_info%v = %v, want %v = 1", got, m.GetGauge().GetValue(), want)
		}
		return nil
	}
	return errors.New("buildinfo: no kvr_build_info series")
}
