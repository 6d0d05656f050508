package natsconn

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/nats-io/nats-server/v2/server"
)

func TestConnectUserPassword(t *testing.T) {
	s := natstest.Start(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "router", Password: "s3cret"}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := Connect(ctx, Config{URLs: s.ClientURL(), User: "router", Password: "s3cret"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	// A wrong password fails at once rather than retrying until ctx ends.
	t0 := time.Now()
	_, err = Connect(ctx, Config{URLs: s.ClientURL(), User: "router", Password: "wrong"}, nil, nil)
	if err == nil || time.Since(t0) > 5*time.Second {
		t.Fatalf("wrong password: err %v after %v", err, time.Since(t0))
	}
}

// TLS with a custom CA: the client trusts only the CA file it is given.
func TestConnectTLSCustomCA(t *testing.T) {
	dir := t.TempDir()
	caFile, serverCert := makeCA(t, dir)
	s := natstest.Start(t, func(o *server.Options) {
		o.TLS = true
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}
		o.TLSTimeout = 2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)
	nc, err := Connect(ctx, Config{URLs: url, TLSCAFile: caFile}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !nc.TLSRequired() {
		t.Error("connection is not TLS")
	}
	nc.Close()
	// Without the CA the certificate is rejected (and not retried).
	if _, err := Connect(ctx, Config{URLs: url}, nil, nil); err == nil || !strings.Contains(err.Error(), "x509") {
		t.Fatalf("without CA: %v", err)
	}
	if _, err := Connect(ctx, Config{URLs: url, TLSCAFile: filepath.Join(dir, "missing.pem")}, nil, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("missing CA file: %v", err)
	}
}

func TestConnectEmbeddedAndErrors(t *testing.T) {
	emb, err := StartEmbedded(Config{Embedded: true, EmbeddedListen: "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Shutdown()
	if emb.URL() == "" {
		t.Fatal("embedded server listens nowhere")
	}
	ctx := context.Background()
	nc, err := Connect(ctx, Config{Embedded: true}, emb, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, err := Connect(ctx, Config{}, nil, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("no URL: %v", err)
	}
	if _, err := StartEmbedded(Config{Embedded: true, EmbeddedListen: "nonsense"}, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad listen address: %v", err)
	}
	// A listen port already taken is the error, not a wait for readiness
	// that never comes.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := StartEmbedded(Config{Embedded: true, EmbeddedListen: l.Addr().String()}, nil); err == nil ||
		!strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("listen port taken: %v, want the listen error", err)
	}
	if got := redactURLs("nats://u:p@h:4222,nats://h2:4222"); got != "nats://***@h:4222,nats://h2:4222" {
		t.Fatalf("redact: %q", got)
	}
}

// makeCA writes a CA certificate to dir and returns its path and a server
// certificate for 127.0.0.1 signed by it.
func makeCA(t *testing.T, dir string) (string, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvrouter test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
