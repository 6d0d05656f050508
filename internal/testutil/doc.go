// Package testutil holds the helpers every package's tests share, so that
// there is one of each: Eventually, the one way a test waits for a
// condition instead of sleeping, Budget, how long a wait that only load
// delays may take (until shortly before the test's deadline), and
// FreePorts, a run of consecutive free ports (an engine's data-parallel
// ranks), and SumCounter, a counter's value from a manual metric reader. Embedded NATS servers for tests live in internal/natstest.
package testutil
