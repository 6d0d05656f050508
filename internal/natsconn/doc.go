// Package natsconn is how every kvrouter program reaches NATS: the
// connection settings (URLs, credentials file, nkey, user and password, TLS
// with a custom CA and client certificates), the embedded JetStream server
// for single-machine setups, and Open, which starts the embedded server when
// asked and connects (with reconnects and logged disconnects).
//
// It owns no subjects and no protocol: those are in router/api, kvevents,
// workers and bindings. Command-line flags for these settings are in
// cmd/kvrouter (flags.go).
//
// Where to start reading: Config and Open in natsconn.go.
package natsconn
