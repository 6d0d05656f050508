package natsconn

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded server authentication modes (Config.EmbeddedAuth).
const (
	// AuthAuto turns authentication on when the server listens beyond
	// loopback and leaves it off on loopback or in-process only.
	AuthAuto = "auto"
	// AuthOn always requires credentials (when the server listens at all).
	AuthOn = "on"
	// AuthOff never does; refused for a listen address beyond loopback.
	AuthOff = "off"
)

// GeneratedUser is the user name of generated embedded credentials.
const GeneratedUser = "kvrouter"

// PasswordFileName is the file in the data directory that holds the
// generated password of GeneratedUser (one line, mode 0600). A file that
// is already there is used as it is, so an operator may write their own.
const PasswordFileName = "nats-password"

// ErrOpenListen refuses an embedded server that would accept anyone from
// beyond loopback.
var ErrOpenListen = errors.New("embedded nats: refusing to listen beyond loopback without authentication")

// EmbeddedAuth says how the embedded server authenticates clients.
type EmbeddedAuth struct {
	On bool
	// User and Password are what this process's own in-process connection
	// presents: the generated credentials, or --nats-user/--nats-password
	// with a users file (ConfigFile).
	User, Password string
	// PasswordFile holds the generated password ("" with ConfigFile).
	PasswordFile string
	// Generated is set when the password was created by this start.
	Generated bool
	// ConfigFile is the NATS server configuration whose users were loaded.
	ConfigFile string
}

// listensBeyondLoopback reports whether host:port accepts connections from
// other machines: an empty or unspecified host (all interfaces), or any
// host that is not a loopback IP or "localhost".
func listensBeyondLoopback(host string) bool {
	if host == "" {
		return true
	}
	if strings.EqualFold(host, "localhost") {
		return false
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip == nil || !ip.IsLoopback()
}

// setupAuth decides and applies the embedded server's authentication.
// listening says whether the server has a socket at all; storeDir is where a
// generated password goes.
func setupAuth(cfg Config, opts *server.Options, listening bool, storeDir string, log *slog.Logger) (EmbeddedAuth, error) {
	mode := cfg.EmbeddedAuth
	if mode == "" {
		mode = AuthAuto
	}
	open := listening && listensBeyondLoopback(opts.Host)
	var on bool
	switch mode {
	case AuthAuto:
		on = open || cfg.EmbeddedAuthConfig != ""
	case AuthOn:
		on = true
	case AuthOff:
		if open {
			return EmbeddedAuth{}, fmt.Errorf("%w: --embedded-auth off with listen address %q", ErrOpenListen, cfg.EmbeddedListen)
		}
		if cfg.EmbeddedAuthConfig != "" {
			return EmbeddedAuth{}, fmt.Errorf("%w: --embedded-auth off contradicts --embedded-auth-config %s", ErrConfig, cfg.EmbeddedAuthConfig)
		}
	default:
		return EmbeddedAuth{}, fmt.Errorf("%w: embedded auth mode %q (want auto, on or off)", ErrConfig, mode)
	}
	if !on {
		return EmbeddedAuth{}, nil
	}
	if cfg.EmbeddedAuthConfig != "" {
		return loadUsers(cfg, opts)
	}
	return generatedUser(opts, storeDir, log)
}

// loadUsers takes the users, nkeys and their permissions from a NATS server
// configuration file (deploy/nats/auth.conf, for one).
func loadUsers(cfg Config, opts *server.Options) (EmbeddedAuth, error) {
	fo, err := server.ProcessConfigFile(cfg.EmbeddedAuthConfig)
	if err != nil {
		return EmbeddedAuth{}, fmt.Errorf("%w: embedded auth config %s: %v", ErrConfig, cfg.EmbeddedAuthConfig, err)
	}
	if len(fo.Users) == 0 && len(fo.Nkeys) == 0 {
		return EmbeddedAuth{}, fmt.Errorf("%w: embedded auth config %s defines no users or nkeys", ErrConfig, cfg.EmbeddedAuthConfig)
	}
	if cfg.User == "" && cfg.NKeySeedFile == "" {
		return EmbeddedAuth{}, fmt.Errorf("%w: embedded auth config %s: give this process's own user (--nats-user and --nats-password)", ErrConfig, cfg.EmbeddedAuthConfig)
	}
	opts.Users, opts.Nkeys = fo.Users, fo.Nkeys
	return EmbeddedAuth{On: true, User: cfg.User, Password: cfg.Password, ConfigFile: cfg.EmbeddedAuthConfig}, nil
}

// generatedUser gives the server one user, GeneratedUser, whose password is
// read from storeDir/PasswordFileName or, when that file is missing,
// generated (256 random bits) and written there, then logged once.
func generatedUser(opts *server.Options, storeDir string, log *slog.Logger) (EmbeddedAuth, error) {
	path := filepath.Join(storeDir, PasswordFileName)
	a := EmbeddedAuth{On: true, User: GeneratedUser, PasswordFile: path}
	_, err := os.Stat(path)
	switch {
	case err == nil:
		if a.Password, err = ReadPasswordFile(path); err != nil {
			return EmbeddedAuth{}, err
		}
	case errors.Is(err, os.ErrNotExist):
		var raw [32]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return EmbeddedAuth{}, fmt.Errorf("embedded nats: generate password: %w", err)
		}
		a.Password, a.Generated = hex.EncodeToString(raw[:]), true
		if err := os.MkdirAll(storeDir, 0o700); err != nil {
			return EmbeddedAuth{}, fmt.Errorf("embedded nats: data dir %s: %w", storeDir, err)
		}
		if err := os.WriteFile(path, []byte(a.Password+"\n"), 0o600); err != nil {
			return EmbeddedAuth{}, fmt.Errorf("embedded nats: write password file: %w", err)
		}
		if log != nil {
			// Printed once: later starts read the file and log only its path.
			log.Warn("embedded NATS: generated credentials (shown once; other processes use --nats-user "+GeneratedUser+" --nats-password-file "+path+")",
				"user", GeneratedUser, "password", a.Password, "file", path)
		}
	default:
		return EmbeddedAuth{}, fmt.Errorf("embedded nats: password file: %w", err)
	}
	opts.Users = []*server.User{{Username: a.User, Password: a.Password}}
	return a, nil
}

// ReadPasswordFile returns the first line of a password file, trimmed.
func ReadPasswordFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: password file: %v", ErrConfig, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if line = strings.TrimSpace(line); line == "" {
		return "", fmt.Errorf("%w: password file %s is empty", ErrConfig, path)
	}
	return line, nil
}
