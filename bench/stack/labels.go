package stack

import (
	"context"
	"runtime/pprof"
)

// The real path runs every component in one process; a CPU profile tells
// them apart by the profiler label ComponentLabel, which each component's
// goroutines inherit from the goroutine that started them (`go tool pprof
// -tags`, or -tagfocus kvr.component=gateway). The embedded NATS server's
// in-process connections are served by goroutines their client starts, so
// NATS server work is labelled with the connecting component: tell it apart
// by its frames (-focus nats-server). docs/benchmarks.md, "Issue 29", has the
// split of the gateway-path replay.
const ComponentLabel = "kvr.component"

// Component label values.
const (
	componentNATS    = "nats"
	componentRouter  = "router"
	componentEngine  = "engine"
	componentBridge  = "bridge"
	componentGateway = "gateway"
)

// labeled runs f with the profiler label of component, so the goroutines f
// starts carry it.
func labeled(component string, f func()) {
	pprof.Do(context.Background(), pprof.Labels(ComponentLabel, component), func(context.Context) { f() })
}
