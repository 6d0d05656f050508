// Package natstest starts embedded NATS servers with JetStream for tests:
// one server (Start, Connect, JetStream) or a three-node cluster in one
// process (StartCluster). For fault injection a Cluster finds the nodes
// that hold a role (StreamLeader, MetaLeader, ConsumerHost) and stops them
// (Stop, then Start, or Restart). Every package's tests use it; no
// production code does.
package natstest
