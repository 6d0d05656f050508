// Package workerref is the one vocabulary for naming a worker and,
// optionally, one of its data-parallel ranks: Target, its one printed form
// (String: "worker" or "worker#rank") and its one agreement rule (Agrees).
//
// It is a leaf: it imports nothing of kvrouter, so the scheduler, the
// bindings table, the wire contract and the host can all share it without
// importing each other. It does not own what a target means for routing
// (the pin rule is router/scheduler's, the commit rule is bindings') nor
// how a target is encoded on the wire (router/api).
package workerref
