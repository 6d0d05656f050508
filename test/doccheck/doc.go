// Package doccheck holds tests that keep the documentation true: that
// docs/protocol.md and README.md stand alone (no links out of the
// repository, every link and anchor resolves), that the protocol's one
// error table lists exactly the error codes and statuses the code defines,
// and that a worker registering with the raw NATS messages the protocol
// describes is seen by the routers' membership view.
//
// It has no non-test code. Start reading at links_test.go; the registry
// walk-through is registry_test.go.
package doccheck
