package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvrouter/kvrouter/internal/buildinfo"
	"github.com/kvrouter/kvrouter/internal/jskv"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers"
	"github.com/nats-io/nats.go/jetstream"
)

// cmdFlags is a flag set in which every flag also reads an environment
// variable: --nats-url <-> KVR_NATS_URL. A flag given on the command line
// wins over its variable, which wins over the default. --help lists every
// flag with its variable and default.
type cmdFlags struct {
	*flag.FlagSet
	name  string
	about string
	env   map[string]string // flag name -> variable
	order []string
	// helpOut receives --help (stdout); errors go to the flag set's
	// output (stderr).
	helpOut io.Writer
}

func newFlags(name, about string) *cmdFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	c := &cmdFlags{FlagSet: fs, name: name, about: about, env: map[string]string{}, helpOut: os.Stdout}
	fs.Usage = func() { c.usage(fs.Output()) }
	return c
}

// envName is the variable of a flag: KVR_ + upper case, '-' as '_'.
func envName(flagName string) string {
	return "KVR_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (c *cmdFlags) track(name string) {
	c.env[name] = envName(name)
	c.order = append(c.order, name)
}

func (c *cmdFlags) str(name, def, usage string) *string {
	c.track(name)
	return c.String(name, def, usage)
}

func (c *cmdFlags) integer(name string, def int, usage string) *int {
	c.track(name)
	return c.Int(name, def, usage)
}

func (c *cmdFlags) float(name string, def float64, usage string) *float64 {
	c.track(name)
	return c.Float64(name, def, usage)
}

func (c *cmdFlags) boolean(name string, def bool, usage string) *bool {
	c.track(name)
	return c.Bool(name, def, usage)
}

func (c *cmdFlags) duration(name string, def time.Duration, usage string) *time.Duration {
	c.track(name)
	return c.Duration(name, def, usage)
}

func (c *cmdFlags) uint64(name string, def uint64, usage string) *uint64 {
	c.track(name)
	return c.Uint64(name, def, usage)
}

// parse reads args, then the environment for every flag not given. It
// returns flag.ErrHelp after printing the help for -h/--help.
func (c *cmdFlags) parse(args []string) error {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			c.usage(c.helpOut)
			return flag.ErrHelp
		}
	}
	if err := c.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	c.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range c.order {
		if given[name] {
			continue
		}
		v, ok := os.LookupEnv(c.env[name])
		if !ok {
			continue
		}
		if err := c.Set(name, v); err != nil {
			return fmt.Errorf("%s: %s=%q: %w", c.name, c.env[name], v, err)
		}
	}
	if c.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (flags only; see --help)", c.name, c.Arg(0))
	}
	return nil
}

func (c *cmdFlags) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s [flags]\n\n%s\n\nFlags (each also read from the environment variable shown; a flag given on the\ncommand line wins over its variable):\n\n", c.name, strings.TrimSpace(c.about))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	names := append([]string(nil), c.order...)
	sort.Strings(names)
	for _, name := range names {
		f := c.Lookup(name)
		typ, usage := flag.UnquoteUsage(f)
		def := f.DefValue
		switch {
		case def == "":
			def = `""`
		case typ == "" && def == "false":
			def = "false"
		}
		arg := "--" + name
		if typ != "" {
			arg += " " + typ
		}
		fmt.Fprintf(tw, "  %s\t%s\n", arg, c.env[name])
		for _, line := range strings.Split(usage, "\n") {
			fmt.Fprintf(tw, "      \t%s\n", line)
		}
		fmt.Fprintf(tw, "      \t(default %s)\n", def)
	}
	tw.Flush()
}

// natsFlags are the connection flags shared by serve and worker.
type natsFlags struct {
	url, creds, nkey, user, password, ca, cert, key *string
	embedded                                        *bool
	dataDir, listen                                 *string
	auth                                            natsAuthFlags
}

// natsAuthFlags are the authentication flags of issue 16: a password file,
// a per-role inbox prefix, and the embedded server's authentication.
type natsAuthFlags struct {
	passwordFile, inboxPrefix, embeddedAuth, embeddedUsers *string
}

func addNATSAuthFlags(c *cmdFlags) natsAuthFlags {
	return natsAuthFlags{
		passwordFile:  c.str("nats-password-file", "", "file whose first line is the NATS password (instead of --nats-password)"),
		inboxPrefix:   c.str("nats-inbox-prefix", "", "prefix of this process's reply inboxes instead of _INBOX (deploy/nats/auth.conf gives each role its own, e.g. _INBOX_router)"),
		embeddedAuth:  c.str("embedded-auth", natsconn.AuthAuto, "embedded server authentication: auto (on when --embedded-listen is beyond loopback), on, or off (refused beyond loopback)"),
		embeddedUsers: c.str("embedded-auth-config", "", "NATS server config file whose users and permissions the embedded server uses (e.g. deploy/nats/auth.conf; this process connects as --nats-user); default: one generated user kvrouter, password in <data-dir>/nats-password"),
	}
}

func (a natsAuthFlags) apply(cfg *natsconn.Config) {
	cfg.PasswordFile, cfg.InboxPrefix = *a.passwordFile, *a.inboxPrefix
	cfg.EmbeddedAuth, cfg.EmbeddedAuthConfig = *a.embeddedAuth, *a.embeddedUsers
}

func addNATSFlags(c *cmdFlags, embeddedDefault bool) *natsFlags {
	return &natsFlags{
		url:      c.str("nats-url", "nats://127.0.0.1:4222", "NATS server URLs, comma separated (ignored with --embedded-nats)"),
		creds:    c.str("nats-creds", "", "NATS credentials file (JWT + nkey seed, as written by nsc)"),
		nkey:     c.str("nats-nkey", "", "NATS nkey seed file"),
		user:     c.str("nats-user", "", "NATS user name (with --nats-password)"),
		password: c.str("nats-password", "", "NATS password"),
		ca:       c.str("nats-tls-ca", "", "PEM file of the CA that signed the NATS server's certificate (enables TLS)"),
		cert:     c.str("nats-tls-cert", "", "PEM client certificate for mutual TLS (with --nats-tls-key)"),
		key:      c.str("nats-tls-key", "", "PEM private key of --nats-tls-cert"),
		embedded: c.boolean("embedded-nats", embeddedDefault, "run a NATS server with JetStream inside this process instead of connecting to one"),
		dataDir:  c.str("data-dir", "", "JetStream store directory of the embedded server (\"\" = a temporary directory, removed at exit)"),
		listen:   c.str("embedded-listen", "127.0.0.1:4222", "address the embedded server listens on for other processes (\"\" = in-process only)"),
		auth:     addNATSAuthFlags(c),
	}
}

func (n *natsFlags) config(name string) natsconn.Config {
	cfg := natsconn.Config{
		URLs: *n.url, CredsFile: *n.creds, NKeySeedFile: *n.nkey, User: *n.user, Password: *n.password,
		TLSCAFile: *n.ca, TLSCertFile: *n.cert, TLSKeyFile: *n.key, Name: name,
		Embedded: *n.embedded, DataDir: *n.dataDir, EmbeddedListen: *n.listen,
	}
	n.auth.apply(&cfg)
	return cfg
}

// replayFlags are the workload and fleet flags that bench replay and demo
// share; each command gives its own defaults and the usages that differ.
type replayFlags struct {
	trace, sessionMode, policies       *string
	limit, workers, replicas, kvBlocks *int
	speedup, load                      *float64
	seed                               *uint64
}

// replayDefaults are one command's defaults for replayFlags.
type replayDefaults struct {
	limit, workers, replicas                                             int
	speedup                                                              float64
	seed                                                                 uint64
	sessionMode, policies                                                string
	limitUsage, speedupUsage, kvBlocksUsage, sessionUsage, policiesUsage string
}

func addReplayFlags(c *cmdFlags, d replayDefaults) *replayFlags {
	return &replayFlags{
		trace:       c.str("trace", "", "Mooncake-format JSONL trace to replay (one hash id = one 512-token block) instead of a synthetic workload"),
		limit:       c.integer("limit", d.limit, d.limitUsage),
		workers:     c.integer("workers", d.workers, "simulated workers"),
		replicas:    c.integer("replicas", d.replicas, "router replicas (one queue group)"),
		speedup:     c.float("speedup", d.speedup, d.speedupUsage),
		load:        c.float("load", 1, "load scaling: multiply the workload's arrival rate"),
		kvBlocks:    c.integer("kv-blocks", 0, d.kvBlocksUsage),
		sessionMode: c.str("session-mode", d.sessionMode, d.sessionUsage),
		policies:    c.str("policies", d.policies, d.policiesUsage),
		seed:        c.uint64("seed", d.seed, "seed of synthetic workloads and of random choices"),
	}
}

// logFlags configure slog.
type logFlags struct {
	command       string
	level, format *string
}

func addLogFlags(c *cmdFlags) *logFlags {
	return &logFlags{
		command: c.name,
		level:   c.str("log-level", "info", "log level: debug, info, warn or error (debug logs per-request events)"),
		format:  c.str("log-format", "text", "log format: text or json"),
	}
}

// logger builds the command's logger and writes its first line, which
// names the command and the build (version, commit, Go) it runs.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	log, err := l.newLogger(w)
	if err != nil {
		return nil, err
	}
	log.Info("starting "+l.command, buildinfo.Get().LogAttrs()...)
	return log, nil
}

func (l *logFlags) newLogger(w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*l.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", *l.level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch *l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", *l.format)
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// helpRequested reports whether err is the flag package's -h/--help.
func helpRequested(err error) bool { return errors.Is(err, flag.ErrHelp) }

// workerSideFlags are the flags every process that acts as a worker (the
// simulated `worker` and the engine `bridge`) shares: where its events go,
// where it registers, and how long it drains.
type workerSideFlags struct {
	prefix, stream, regBucket *string
	heartbeat, ttl, maxDelay  *time.Duration
	drain                     *time.Duration
	setupWait                 *time.Duration
}

// addWorkerSideFlags defines them on c; maxDelay and drainWhat differ per
// command (a bridge batches for less, and waits for the engine's requests).
func addWorkerSideFlags(c *cmdFlags, maxDelay time.Duration, drainWhat string) workerSideFlags {
	return workerSideFlags{
		prefix:    c.str("prefix", kvevents.DefaultPrefix, "first token of every NATS subject"),
		stream:    c.str("event-stream", kvevents.DefaultStream, "JetStream stream of KV events (kvrouter serve creates it; this process waits for it)"),
		regBucket: c.str("registry-bucket", workers.DefaultBucket, "KV bucket of the worker registry"),
		heartbeat: c.duration("heartbeat", workers.DefaultHeartbeat, "registry heartbeat period"),
		ttl:       c.duration("registry-ttl", workers.DefaultTTL, "registry key TTL: a worker silent this long is departed (whole seconds)"),
		maxDelay:  c.duration("event-max-delay", maxDelay, "longest a KV event waits in the publisher's batch"),
		drain:     c.duration("drain-timeout", 30*time.Second, "longest wait for "+drainWhat+" when stopping; also the drain deadline every router honours (Hard sessions stay on this worker until then)"),
		setupWait: c.duration("setup-wait", defaultSetupWait, "longest wait at start for the event stream and registry bucket that kvrouter serve creates"),
	}
}

// registry is the registry configuration the flags name.
func (w workerSideFlags) registry(log *slog.Logger) workers.RegistryConfig {
	return workers.RegistryConfig{Bucket: *w.regBucket, TTL: *w.ttl, Heartbeat: *w.heartbeat, Logger: log}
}

// defaultSetupWait is how long a worker-side process waits at start for
// the router replica to create the event stream and the registry bucket:
// long enough for processes started together, short enough that a missing
// `kvrouter serve` is reported while someone is watching.
const defaultSetupWait = time.Minute

// connect opens the NATS connection nf names and waits (at most
// --setup-wait) until the event stream and the registry bucket exist, as
// every worker-side process needs before it publishes or registers. It
// never changes them, and creates them only on its own embedded server
// (--embedded-nats: nobody else can): the router replica owns their
// configuration (replicas, limits), and a worker that created them would
// decide it with its own defaults. The caller closes the connection.
func (w workerSideFlags) connect(ctx context.Context, nf *natsFlags, name string, log *slog.Logger) (*natsconn.Conn, jetstream.JetStream, error) {
	nc, err := natsconn.Open(ctx, nf.config(name), log)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc.Conn)
	switch {
	case err != nil:
	case *nf.embedded:
		// Create when missing, never update (a nil owner verifies nothing);
		// Register creates the registry bucket the same way.
		_, err = kvevents.SetUpStream(ctx, js, kvevents.StreamConfig{Name: *w.stream, Prefix: *w.prefix}, jskv.Owner{})
	default:
		err = w.awaitSetup(ctx, js, log)
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// awaitSetup waits until the event stream and the registry bucket exist.
func (w workerSideFlags) awaitSetup(ctx context.Context, js jetstream.JetStream, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, *w.setupWait)
	defer cancel()
	if _, err := kvevents.LookupStream(ctx, js, *w.stream); err != nil {
		return err
	}
	if _, err := jskv.WaitBucket(ctx, js, *w.regBucket); err != nil {
		return fmt.Errorf("worker registry: %w: start kvrouter serve first (the router replica creates it), or check --registry-bucket", err)
	}
	log.Debug("event stream and registry bucket found", "stream", *w.stream, "bucket", *w.regBucket)
	return nil
}
