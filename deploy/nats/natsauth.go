// Package natsauth holds what deploy/nats/auth.conf needs from Go: the
// values of a worker user's subject variables, computed with the escapings
// the components use (their subject builders, which escape with
// internal/escape's SubjectToken, and workers.KeyFor), so they can never
// drift apart, WithWorkerUser, which adds a worker user to auth.conf's
// text as its README says, and WithGatewayUser, which gives one gateway
// instance a user and inbox of its own. The permission tests of auth.conf
// are in this directory too (auth_test.go); `go run ./deploy/nats/workerenv`
// prints the variables for one worker, `go run ./deploy/nats/gatewayusers`
// writes auth.conf with a user per gateway instance.
//
// Where to start reading: auth.conf and README.md, then WorkerEnv.
package natsauth

import (
	"errors"
	"fmt"
	"regexp"
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

// GatewayUser is what WithGatewayUser gives one gateway instance: its NATS
// user, the inbox prefix it must connect with (--nats-inbox-prefix), the
// only inboxes it may read, the variable holding its password, and its
// permissions block in auth.conf.
type GatewayUser struct {
	Instance    string
	User        string // gateway-<instance>
	Inbox       string // _INBOX_gateway_<instance>
	PasswordVar string // NATS_GATEWAY_<INSTANCE>_PASSWORD, '-' as '_'
	Perms       string // GATEWAY_<INSTANCE>
}

// instanceName is what a gateway instance may be called: one subject
// token and, upper-cased, part of a configuration variable's name.
var instanceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// GatewayUserOf names the user of gateway instance (letters, digits, '-'
// and '_', at most 64). Its inbox prefix starts with _INBOX_gateway_, a
// token no other role's inboxes (_INBOX_router, _INBOX_gateway...) share.
func GatewayUserOf(instance string) (GatewayUser, error) {
	if !instanceName.MatchString(instance) {
		return GatewayUser{}, fmt.Errorf("natsauth: gateway instance %q: want 1-64 letters, digits, '-' or '_', starting with a letter or digit", instance)
	}
	v := strings.ToUpper(strings.ReplaceAll(instance, "-", "_"))
	return GatewayUser{Instance: instance, User: "gateway-" + instance, Inbox: "_INBOX_gateway_" + instance,
		PasswordVar: "NATS_GATEWAY_" + v + "_PASSWORD", Perms: "GATEWAY_" + v}, nil
}

const (
	gatewayBlock    = "  GATEWAY = {"
	gatewayInbox    = `subscribe = { allow = ["_INBOX_gateway.>"] }`
	sharedGateway   = "    {user: gateway, password: $NATS_GATEWAY_PASSWORD, permissions: $GATEWAY}\n"
	usersStart      = "  users = [\n"
	blockEnd        = "\n  }\n"
	usersEnd        = "\n  ]\n"
	errGatewayBlock = "natsauth: auth.conf's GATEWAY block or users list not found"
)

// WithGatewayUser returns conf (auth.conf's text) with a user of its own
// for gateway instance, as deploy/nats/README.md ("One user per gateway")
// describes: the GATEWAY block copied as GatewayUser.Perms with the
// instance's inboxes as the only subjects it may read, and the user
// {user: <User>, password: $<PasswordVar>, permissions: $<Perms>}. So no
// gateway reads another's route replies, or their fences.
func WithGatewayUser(conf, instance string) (string, GatewayUser, error) {
	u, err := GatewayUserOf(instance)
	if err != nil {
		return "", u, err
	}
	if strings.Contains(conf, "\n  "+u.Perms+" = {") {
		return "", u, fmt.Errorf("natsauth: auth.conf has a block %s already (gateway instance %q, or one named alike)", u.Perms, instance)
	}
	start := strings.Index(conf, gatewayBlock)
	end, users := -1, strings.Index(conf, usersStart)
	if start >= 0 {
		end = strings.Index(conf[start:], blockEnd)
	}
	if start < 0 || end < 0 || users < 0 || !strings.Contains(conf[users:], usersEnd) {
		return "", u, errors.New(errGatewayBlock)
	}
	block := conf[start : start+end+len(blockEnd)]
	if !strings.Contains(block, gatewayInbox) {
		return "", u, errors.New("natsauth: auth.conf's GATEWAY block does not subscribe to _INBOX_gateway.> alone")
	}
	copied := strings.Replace(block, gatewayBlock, "  "+u.Perms+" = {", 1)
	copied = strings.Replace(copied, gatewayInbox, `subscribe = { allow = ["`+u.Inbox+`.>"] }`, 1)
	conf = conf[:start] + block + "\n  # Gateway instance " + u.Instance + " (deploy/nats/gatewayusers).\n" + copied + conf[start+len(block):]
	users = strings.Index(conf, usersStart)
	at := users + strings.Index(conf[users:], usersEnd) + 1
	line := "    {user: " + u.User + ", password: $" + u.PasswordVar + ", permissions: $" + u.Perms + "}\n"
	return conf[:at] + line + conf[at:], u, nil
}

// WithoutSharedGateway returns conf without the shared gateway user (its
// GATEWAY block stays, the template of WithGatewayUser's copies): once
// every gateway has its own user, nobody holds the shared one.
func WithoutSharedGateway(conf string) (string, error) {
	if !strings.Contains(conf, sharedGateway) {
		return "", errors.New("natsauth: auth.conf's shared gateway user line not found")
	}
	return strings.Replace(conf, sharedGateway, "", 1), nil
}
