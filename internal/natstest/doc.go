// Package natstest starts embedded NATS servers with JetStream for tests:
// one server (Start, Connect, JetStream) or a cluster of n nodes in one
// process (StartCluster). Start-up waits are bounded by the test's own
// deadline (testutil.Budget), so a loaded machine slows them without
// failing them. For fault injection a Cluster finds the nodes
// that hold a role (StreamLeader, MetaLeader, ConsumerHost) and stops them
// (Stop, then Start, or Restart). Every package's tests use it; no
// production code does.
package natstest
