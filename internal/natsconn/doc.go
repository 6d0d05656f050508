// Package natsconn is how every kvrouter program reaches NATS: the
// connection settings (URLs, credentials file, nkey, user and password or a
// password file, TLS with a custom CA and client certificates, the reply
// inbox prefix a role's permissions allow), the embedded JetStream server
// for single-machine setups with its authentication, and Open, which starts
// the embedded server when asked and connects (with reconnects and logged
// disconnects).
//
// The embedded server requires credentials whenever it listens beyond
// loopback (auth.go): one generated user whose password lives in the data
// directory, or the users and permissions of a NATS configuration file such
// as deploy/nats/auth.conf. It refuses to listen openly.
//
// It owns no subjects and no protocol: those are in router/api, kvevents,
// workers and bindings. Command-line flags for these settings are in
// cmd/kvrouter (flags.go).
//
// Where to start reading: Config and Open in natsconn.go, then setupAuth in
// auth.go.
package natsconn
