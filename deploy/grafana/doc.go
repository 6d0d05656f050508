// Package grafana builds kvrouter's Grafana dashboard (kvrouter.json
// beside this file) from Go code with the Grafana Foundation SDK's typed
// builders, so a panel's query names a metric in one place, here, and a
// test keeps those names in step with what the binaries export
// (test/realpath's TestDashboardQueriesNameLiveMetrics reads live
// /metrics pages) and the committed JSON in step with this code
// (TestCommittedDashboardIsGenerated).
//
// It owns the dashboard only: the metrics are defined where they are
// recorded (router/host, gateway, workers/bridge, workers/sim/vllmapi for
// the vLLM names an engine exports). Where to start reading: Dashboard.
// Regenerate with `go generate ./deploy/grafana`.
package grafana

//go:generate go run ./gendashboard -out kvrouter.json
