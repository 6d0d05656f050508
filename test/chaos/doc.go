// Package chaos is the fault test of issue 15 and the library it is built
// from: a fleet on an in-process three-node NATS cluster (fleet.go: three
// router replicas, registered workers, clients on HTTP and NATS, node
// stops and restarts), a recorder of every request's invoke, return and
// reply (history.go), and the checkers that judge the whole history
// (check.go): a porcupine model of one session's binding for the Hard
// sessions (model.go), a staleness bound for the Soft ones (staleness.go),
// no Hard session served by two workers, and every request answered in
// time with a documented code; revisions.go watches the bindings' revisions
// and writes what a run keeps for its analysis (KVR_CHAOS_OUT).
//
// Start reading at fault_test.go (TestFaults: what runs, in what order,
// and what is checked), then check.go. docs/faults.md says how to run the
// short and the long form and what each checker accepts.
//
// It is test support: no production code imports it.
package chaos
