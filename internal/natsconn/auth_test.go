package natsconn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// loopbackURL is a URL that reaches emb over loopback TCP, whatever
// address it listens on.
func loopbackURL(t *testing.T, emb *Embedded) string {
	t.Helper()
	addr, ok := emb.Server.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("embedded server listens nowhere: %v", emb.Server.Addr())
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", addr.Port)
}

// dial connects over TCP with the given options and no retry.
func dial(url string, opts ...nats.Option) error {
	nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second))...)
	if err == nil {
		nc.Close()
	}
	return err
}

// writeUsersConf writes a NATS configuration with two users: router (all
// permissions) and client (publish ok.> only).
func writeUsersConf(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "users.conf")
	if err := os.WriteFile(path, []byte(`authorization { users = [
		{user: router, password: "r-secret"},
		{user: client, password: "c-secret", permissions: {publish: ["ok.>"], subscribe: ["_INBOX.>"]}}
	]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestEmbeddedAuthBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := Config{Embedded: true, DataDir: dir, EmbeddedListen: "0.0.0.0:0"}
	conn, err := Open(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	auth := conn.Embedded.Auth
	if !auth.On || !auth.Generated || auth.User != GeneratedUser {
		t.Fatalf("auth %+v: want generated credentials on 0.0.0.0", auth)
	}
	// The process's own in-process connection is authenticated and works.
	if err := conn.Publish("x", nil); err != nil || conn.Flush() != nil {
		t.Fatalf("own connection: %v", err)
	}
	url := loopbackURL(t, conn.Embedded)
	if err := dial(url); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("unauthenticated client: %v, want an authorization error", err)
	}
	if err := dial(url, nats.UserInfo(GeneratedUser, "wrong")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("wrong password: %v, want an authorization error", err)
	}
	// The file holds the password, readable by its owner only, and was
	// printed once.
	st, err := os.Stat(filepath.Join(dir, PasswordFileName))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("password file: %v, mode %v", err, st.Mode())
	}
	if !strings.Contains(logs.String(), auth.Password) {
		t.Fatalf("generated password not printed: %s", logs.String())
	}
	other := Config{URLs: url, User: GeneratedUser, PasswordFile: auth.PasswordFile}
	nc, err := Connect(context.Background(), other, nil, nil)
	if err != nil {
		t.Fatalf("the password file's credentials: %v", err)
	}
	nc.Close()
	conn.Close()

	// A restart with the same data dir keeps the password and does not
	// print it again.
	logs.Reset()
	conn, err = Open(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if a := conn.Embedded.Auth; a.Generated || a.Password != auth.Password {
		t.Fatalf("restart: auth %+v, want the stored password", a)
	}
	if strings.Contains(logs.String(), auth.Password) {
		t.Fatal("password printed again on restart")
	}
}

func TestEmbeddedAuthModes(t *testing.T) {
	usersConf := writeUsersConf(t)
	tests := []struct {
		name     string
		cfg      Config
		wantErr  error
		wantAuth bool
	}{
		{"loopback stays open", Config{EmbeddedListen: "127.0.0.1:0"}, nil, false},
		{"localhost stays open", Config{EmbeddedListen: "localhost:0"}, nil, false},
		{"in-process only stays open", Config{}, nil, false},
		{"loopback with auth on", Config{EmbeddedListen: "127.0.0.1:0", EmbeddedAuth: AuthOn}, nil, true},
		{"all interfaces, empty host", Config{EmbeddedListen: ":0"}, nil, true},
		{"off beyond loopback refused", Config{EmbeddedListen: "0.0.0.0:0", EmbeddedAuth: AuthOff}, ErrOpenListen, false},
		{"off beyond loopback refused, host name", Config{EmbeddedListen: "nats.example:0", EmbeddedAuth: AuthOff}, ErrOpenListen, false},
		{"unknown mode", Config{EmbeddedListen: "127.0.0.1:0", EmbeddedAuth: "maybe"}, ErrConfig, false},
		{"users file", Config{EmbeddedListen: "127.0.0.1:0", EmbeddedAuthConfig: usersConf, User: "router", Password: "r-secret"}, nil, true},
		{"users file without own user", Config{EmbeddedListen: "127.0.0.1:0", EmbeddedAuthConfig: usersConf}, ErrConfig, false},
		{"users file missing", Config{EmbeddedListen: "127.0.0.1:0", EmbeddedAuthConfig: usersConf + ".missing", User: "router"}, ErrConfig, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Embedded, tt.cfg.DataDir = true, t.TempDir()
			conn, err := Open(context.Background(), tt.cfg, nil)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Open: %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if conn.Embedded.Auth.On != tt.wantAuth {
				t.Fatalf("auth on = %v, want %v", conn.Embedded.Auth.On, tt.wantAuth)
			}
			if err := conn.Publish("x", nil); err != nil || conn.Flush() != nil {
				t.Fatalf("own connection: %v", err)
			}
			if conn.Embedded.URL() == "" {
				return
			}
			url := loopbackURL(t, conn.Embedded)
			err = dial(url)
			if tt.wantAuth != errors.Is(err, nats.ErrAuthorization) {
				t.Fatalf("unauthenticated client: %v (auth on %v)", err, tt.wantAuth)
			}
			if !tt.wantAuth && err != nil {
				t.Fatalf("unauthenticated client on an open server: %v", err)
			}
		})
	}
}

// With a users file the embedded server enforces its permissions.
func TestEmbeddedUsersFilePermissions(t *testing.T) {
	usersConf := writeUsersConf(t)
	conn, err := Open(context.Background(), Config{Embedded: true, DataDir: t.TempDir(), EmbeddedListen: "127.0.0.1:0",
		EmbeddedAuthConfig: usersConf, User: "router", Password: "r-secret"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	errs := make(chan error, 1)
	nc, err := nats.Connect(loopbackURL(t, conn.Embedded), nats.UserInfo("client", "c-secret"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("forbidden.x", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("async error %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publish outside the user's permissions was not refused")
	}
}
