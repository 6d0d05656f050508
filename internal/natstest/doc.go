// Package natstest starts embedded NATS servers with JetStream for tests:
// one server (Start, Connect, JetStream) or a three-node cluster in one
// process (StartCluster, with StreamLeader and Restart for fault
// injection). Every package's tests use it; no production code does.
package natstest
