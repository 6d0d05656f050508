// Package buildinfo says which build of kvrouter is running: the release
// and the commit, stamped at link time (-ldflags -X, as deploy/image does)
// or else read from the Go toolchain's VCS stamp, and the Go version.
//
// It owns the version text of `kvrouter --version`, the attributes of the
// start-up log line and the kvr_build_info gauge that every /metrics
// registry carries. It owns no flag and no exporter: cmd/kvrouter prints
// and logs it, internal/telemetry and workers/bridge register the gauge.
//
// Where to start reading: Get, then Collector.
package buildinfo
