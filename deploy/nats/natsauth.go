// Package natsauth holds what deploy/nats/auth.conf needs from Go: the
// values of a worker user's subject variables, computed with the escapings
// the components use (their subject builders, which escape with
// internal/escape's SubjectToken, and workers.KeyFor), so they can never
// drift apart, and WithWorkerUser, which adds a worker user to auth.conf's
// text as its README says. The permission tests of auth.conf are in this
// directory too (auth_test.go); `go run ./deploy/nats/workerenv` prints the
// variables for one worker.
//
// Where to start reading: auth.conf and README.md, then WorkerEnv.
package natsauth

import (
	"errors"
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

// WithWorkerUser returns conf (auth.conf's text) with one more worker user,
// as deploy/nats/README.md tells operators to add one: the WORKER block
// copied as <PERMS> = {...} with its variables renamed from NATS_WORKER_ to
// <varPrefix>_, and the user {user: <user>, password: $<varPrefix>_PASSWORD,
// permissions: $<PERMS>}, PERMS being varPrefix without "NATS_"
// (NATS_WORKER2 gives WORKER2). Tests and tools that run several workers
// on the shipped configuration use it.
func WithWorkerUser(conf, user, varPrefix string) (string, error) {
	start := strings.Index(conf, "  WORKER = {")
	end := -1
	if start >= 0 {
		end = strings.Index(conf[start:], "\n  }\n")
	}
	userLine := "    {user: worker,  password: $NATS_WORKER_PASSWORD,  permissions: $WORKER}\n"
	if start < 0 || end < 0 || !strings.Contains(conf, userLine) {
		return "", errors.New("natsauth: auth.conf's WORKER block or worker user line not found")
	}
	perms := strings.TrimPrefix(varPrefix, "NATS_")
	block := conf[start : start+end+len("\n  }\n")]
	copied := strings.ReplaceAll(strings.Replace(block, "WORKER = {", perms+" = {", 1), "$"+DefaultWorkerVar+"_", "$"+varPrefix+"_")
	conf = conf[:start] + block + "\n" + copied + conf[start+len(block):]
	return strings.Replace(conf, userLine, userLine+
		"    {user: "+user+", password: $"+varPrefix+"_PASSWORD, permissions: $"+perms+"}\n", 1), nil
}
