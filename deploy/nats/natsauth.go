// Package natsauth holds what deploy/nats/auth.conf needs from Go: the
// values of a worker user's subject variables, computed with the escapings
// the components use (their subject builders, which escape with
// internal/escape's SubjectToken, and workers.KeyFor), so they can never
// drift apart. The permission tests of auth.conf are in this
// directory too (auth_test.go); `go run ./deploy/nats/workerenv` prints the
// variables for one worker.
//
// Where to start reading: auth.conf and README.md, then WorkerEnv.
package natsauth

import (
	"strings"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// DefaultWorkerVar is the prefix of the worker user's variables in
// auth.conf; a copied block for a second worker uses another (NATS_WORKER2).
const DefaultWorkerVar = "NATS_WORKER"

// WorkerEnv returns the variables auth.conf's worker block reads for the
// worker id of model, under the default names (prefix "kvr", bucket
// "kvr-workers"), keyed varPrefix+"_EVENTS" and so on. Each value is a
// quoted NATS configuration string: the server parses a variable's value
// as configuration, where an unquoted '$' starts a variable reference and
// '#' a comment, and subject tokens may hold both.
func WorkerEnv(varPrefix, model, worker string) map[string]string {
	return map[string]string{
		varPrefix + "_EVENTS":   confString(kvevents.EventSubject(kvevents.DefaultPrefix, model, worker)),
		varPrefix + "_LOAD":     confString(workers.LoadSubject(workers.DefaultPrefix, model, worker)),
		varPrefix + "_KEY":      confString("$KV." + workers.DefaultBucket + "." + workers.KeyFor(worker)),
		varPrefix + "_GENERATE": confString(sim.GenerateSubject(kvevents.DefaultPrefix, model, worker)),
	}
}

// confString quotes s for a NATS configuration file: backslash and double
// quote are the only bytes of a subject that need escaping there.
func confString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
