package natsconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/internal/natslog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Config says how to reach NATS. With Embedded set, StartEmbedded runs a
// server inside the process and Connect reaches it in-process; otherwise URLs
// and the credentials below are used.
type Config struct {
	URLs         string // comma-separated nats:// or tls:// URLs
	CredsFile    string // JWT + nkey credentials file (nsc)
	NKeySeedFile string // nkey seed file
	User         string
	Password     string
	PasswordFile string // read Password from this file (first line) when Password is empty
	// InboxPrefix replaces "_INBOX" in this connection's reply subjects, so
	// that a server's permissions can give each role inboxes of its own
	// (deploy/nats/auth.conf); "" = "_INBOX".
	InboxPrefix string
	TLSCAFile   string // custom CA to verify the server
	TLSCertFile string // client certificate (mutual TLS)
	TLSKeyFile  string
	Name        string // connection name shown by the server

	Embedded       bool
	DataDir        string // JetStream store of the embedded server; "" = a temporary directory
	EmbeddedListen string // host:port the embedded server listens on; "" = in-process only
	MaxPayload     int32  // embedded server max message size; 0 = 8 MiB
	// EmbeddedAuth is AuthAuto (""), AuthOn or AuthOff: whether the embedded
	// server requires credentials (auth.go). Auto turns it on whenever the
	// server listens beyond loopback; off is refused there.
	EmbeddedAuth string
	// EmbeddedAuthConfig is a NATS server configuration file whose users and
	// permissions the embedded server uses (e.g. deploy/nats/auth.conf);
	// this process then connects as User. Without it the server has one
	// generated user (GeneratedUser, password in DataDir/PasswordFileName).
	EmbeddedAuthConfig string
}

// ErrConfig reports an unusable NATS configuration.
var ErrConfig = errors.New("nats config")

// Embedded is a NATS server with JetStream running inside this process.
type Embedded struct {
	Server  *server.Server
	Auth    EmbeddedAuth // what clients must present (Auth.On false: nothing)
	tempDir string
}

// StartEmbedded starts the embedded server described by cfg and waits until
// it accepts connections.
func StartEmbedded(cfg Config, log *slog.Logger) (*Embedded, error) {
	e := &Embedded{}
	dir := cfg.DataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "kvrouter-nats-")
		if err != nil {
			return nil, fmt.Errorf("embedded nats: temp dir: %w", err)
		}
		dir, e.tempDir = d, d
	}
	opts := &server.Options{
		ServerName: "kvrouter-embedded",
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
		MaxPayload: cfg.MaxPayload,
	}
	if opts.MaxPayload == 0 {
		opts.MaxPayload = 8 << 20
	}
	listening := cfg.EmbeddedListen != ""
	if !listening {
		opts.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(cfg.EmbeddedListen)
		if err != nil {
			return nil, fmt.Errorf("%w: embedded listen address %q: %v", ErrConfig, cfg.EmbeddedListen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("%w: embedded listen port %q: %v", ErrConfig, port, err)
		}
		opts.Host, opts.Port = host, p
		if p == 0 {
			opts.Port = server.RANDOM_PORT
		}
	}
	auth, err := setupAuth(cfg, opts, listening, dir, log)
	if err != nil {
		e.cleanup()
		return nil, err
	}
	e.Auth = auth
	s, err := server.NewServer(opts)
	if err != nil {
		e.cleanup()
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	// The server runs without a log (NoLog), so it would report a fatal
	// start-up error (its listen port taken, say) to nobody and never get
	// ready: keep its Fatalf while it starts, and give it as the error.
	s.SetLogger(&natslog.FatalLog{}, false, false)
	go s.Start()
	if err := natslog.WaitReady(s, 15*time.Second); err != nil {
		s.Shutdown()
		e.cleanup()
		if errors.Is(err, natslog.ErrNotReady) {
			return nil, fmt.Errorf("embedded nats: not ready within 15s (store %s)", dir)
		}
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	s.SetLogger(nil, false, false)
	e.Server = s
	if log != nil {
		log.Info("embedded NATS server started", "store", dir, "listen", cfg.EmbeddedListen, "url", e.URL(),
			"auth", auth.On, "user", auth.User, "password_file", auth.PasswordFile, "users_config", auth.ConfigFile)
	}
	return e, nil
}

// URL is the server's client URL, or "" when it listens in-process only.
func (e *Embedded) URL() string {
	if e == nil || e.Server == nil || e.Server.Addr() == nil {
		return ""
	}
	return e.Server.ClientURL()
}

// Shutdown stops the server and removes its temporary store, if any.
func (e *Embedded) Shutdown() {
	if e == nil || e.Server == nil {
		return
	}
	e.Server.Shutdown()
	e.Server.WaitForShutdown()
	e.cleanup()
}

func (e *Embedded) cleanup() {
	if e.tempDir != "" {
		os.RemoveAll(e.tempDir)
		e.tempDir = ""
	}
}

// Connect opens a client connection. With an embedded server the connection
// is in-process (no socket); otherwise it dials cfg.URLs with the configured
// credentials and TLS. It reconnects forever and logs disconnects.
func Connect(ctx context.Context, cfg Config, emb *Embedded, log *slog.Logger) (*nats.Conn, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := cfg.withPasswordFile()
	if err != nil {
		return nil, err
	}
	opts := clientOptions(cfg, log)
	if emb != nil && emb.Server != nil {
		return nats.Connect("", append(opts, embeddedOptions(cfg, emb)...)...)
	}
	if cfg.URLs == "" {
		return nil, fmt.Errorf("%w: no NATS URL given and no embedded server (use --nats-url or --embedded-nats)", ErrConfig)
	}
	remote, err := remoteOptions(cfg)
	if err != nil {
		return nil, err
	}
	return dialRetrying(ctx, cfg.URLs, append(opts, remote...), log)
}

// clientOptions are the options of every connection: its name, endless
// reconnects, the logging of disconnects, reconnects and async errors, and
// the inbox prefix.
func clientOptions(cfg Config, log *slog.Logger) []nats.Option {
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("NATS reconnected", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("NATS async error", "subject", subj, "err", err)
		}),
	}
	if cfg.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(cfg.InboxPrefix))
	}
	return opts
}

// embeddedOptions connect in-process to emb's server, with its own user
// (or cfg's, when given) when the server requires authentication.
func embeddedOptions(cfg Config, emb *Embedded) []nats.Option {
	opts := []nats.Option{nats.InProcessServer(emb.Server)}
	if emb.Auth.On {
		// The process's own connection authenticates like any other:
		// in-process clients are not exempt.
		user, pw := emb.Auth.User, emb.Auth.Password
		if cfg.User != "" {
			user, pw = cfg.User, cfg.Password
		}
		opts = append(opts, nats.UserInfo(user, pw))
	}
	return opts
}

// remoteOptions are the credentials (creds file, NKey seed, user and
// password) and TLS of a connection to a remote server.
func remoteOptions(cfg Config) ([]nats.Option, error) {
	var opts []nats.Option
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nkey seed %s: %v", ErrConfig, cfg.NKeySeedFile, err)
		}
		opts = append(opts, o)
	}
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.TLSCAFile != "" || cfg.TLSCertFile != "" {
		tc, err := tlsConfig(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// dialRetrying connects to urls, retrying the first connect every second
// until ctx ends: in a fresh deployment the router may start before the
// NATS cluster. An authorization or certificate error is not retried.
func dialRetrying(ctx context.Context, urls string, opts []nats.Option, log *slog.Logger) (*nats.Conn, error) {
	for {
		nc, err := nats.Connect(urls, opts...)
		if err == nil {
			return nc, nil
		}
		if errors.Is(err, nats.ErrAuthorization) || strings.Contains(err.Error(), "x509") {
			return nil, fmt.Errorf("connect %s: %w", redactURLs(urls), err)
		}
		log.Warn("NATS connect failed, retrying", "urls", redactURLs(urls), "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect %s: %w (last error: %v)", redactURLs(urls), ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

func tlsConfig(cfg Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS CA %s: %v", ErrConfig, cfg.TLSCAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: TLS CA %s: no PEM certificate found", ErrConfig, cfg.TLSCAFile)
		}
		tc.RootCAs = pool
	}
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS client certificate %s / %s: %v", ErrConfig, cfg.TLSCertFile, cfg.TLSKeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// withPasswordFile fills Password from PasswordFile when only the file is
// given.
func (cfg Config) withPasswordFile() (Config, error) {
	if cfg.Password != "" || cfg.PasswordFile == "" {
		return cfg, nil
	}
	pw, err := ReadPasswordFile(cfg.PasswordFile)
	cfg.Password = pw
	return cfg, err
}

// redactURLs hides passwords in URLs for logs.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		if at := strings.LastIndex(u, "@"); at >= 0 {
			if sch := strings.Index(u, "://"); sch >= 0 && sch < at {
				parts[i] = u[:sch+3] + "***@" + u[at+1:]
			}
		}
	}
	return strings.Join(parts, ",")
}

// Conn is a client connection and, when Config.Embedded is set, the
// embedded server it reaches in-process. Close closes both.
type Conn struct {
	*nats.Conn
	Embedded *Embedded // nil unless Config.Embedded
}

// Open starts the embedded server when cfg asks for one, then connects
// (Connect): the one way serve, worker and bench reach NATS.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Conn, error) {
	cfg, err := cfg.withPasswordFile()
	if err != nil {
		return nil, err
	}
	var emb *Embedded
	if cfg.Embedded {
		if emb, err = StartEmbedded(cfg, log); err != nil {
			return nil, err
		}
	}
	nc, err := Connect(ctx, cfg, emb, log)
	if err != nil {
		emb.Shutdown()
		return nil, err
	}
	return &Conn{Conn: nc, Embedded: emb}, nil
}

// Close closes the connection, then stops the embedded server, if any.
func (c *Conn) Close() {
	c.Conn.Close()
	c.Embedded.Shutdown()
}

// Where describes the connection for a start-up banner: the embedded
// server's URL or the server connected to.
func (c *Conn) Where() string {
	if c.Embedded != nil {
		if u := c.Embedded.URL(); u != "" {
			return "embedded, listening on " + u
		}
		return "embedded, in-process only"
	}
	return c.ConnectedUrlRedacted()
}
