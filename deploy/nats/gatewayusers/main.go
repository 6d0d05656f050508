// Command gatewayusers writes deploy/nats/auth.conf with a NATS user of its
// own for each gateway instance (natsauth.WithGatewayUser), so that no
// gateway or client reads another's route replies and their fences, and
// prints each instance's password and flags:
//
//	go run ./deploy/nats/gatewayusers --instance gw-a --instance gw-b \
//	    --drop-shared --out /etc/nats/auth.conf > gateways.env
//
// gateways.env holds one `export NATS_GATEWAY_<INSTANCE>_PASSWORD=...` per
// instance (for the server's environment, quoted as auth.conf wants) and,
// as comments, the flags of each `kvrouter gateway`: its user, its inbox
// prefix and the password to put in its --nats-password-file.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"

	natsauth "github.com/kvrouter/kvrouter/deploy/nats"
)

type instances []string

func (i *instances) String() string     { return strings.Join(*i, ",") }
func (i *instances) Set(v string) error { *i = append(*i, v); return nil }

func main() {
	var names instances
	flag.Var(&names, "instance", "gateway instance name (repeat for each; letters, digits, '-', '_')")
	in := flag.String("conf", "deploy/nats/auth.conf", "auth.conf to start from")
	out := flag.String("out", "", "file to write the configuration to (required)")
	dropShared := flag.Bool("drop-shared", false, "remove the shared gateway user (every gateway has its own)")
	flag.Parse()
	if len(names) == 0 || *out == "" {
		fmt.Fprintln(os.Stderr, "gatewayusers: --instance (at least one) and --out are required")
		os.Exit(2)
	}
	if err := run(names, *in, *out, *dropShared); err != nil {
		fmt.Fprintln(os.Stderr, "gatewayusers:", err)
		os.Exit(1)
	}
}

func run(names []string, in, out string, dropShared bool) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	conf := string(raw)
	if dropShared {
		if conf, err = natsauth.WithoutSharedGateway(conf); err != nil {
			return err
		}
	}
	var env strings.Builder
	for _, name := range names {
		var u natsauth.GatewayUser
		if conf, u, err = natsauth.WithGatewayUser(conf, name); err != nil {
			return err
		}
		var rnd [24]byte
		_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails
		pw := hex.EncodeToString(rnd[:])
		fmt.Fprintf(&env, "export %s='\"%s\"'\n# %s: kvrouter gateway --nats-user %s --nats-password-file <file holding %s> --nats-inbox-prefix %s ...\n",
			u.PasswordVar, pw, u.Instance, u.User, pw, u.Inbox)
	}
	if err := os.WriteFile(out, []byte(conf), 0o644); err != nil {
		return err
	}
	_, err = os.Stdout.WriteString(env.String())
	return err
}
