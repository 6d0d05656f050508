// Package testutil holds the helpers every package's tests share, so that
// there is one of each: Eventually, the one way a test waits for a
// condition instead of sleeping. Embedded NATS servers for tests live in
// internal/natstest.
package testutil
