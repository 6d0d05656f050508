package vllmzmq

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// This file holds what the publisher and the client side share about
// opening zmq4 sockets.

// attach binds sock to endpoint or connects it, by vLLM's rule (Binds). A
// connect runs in the background on wg and keeps trying until ctx ends, as
// ZeroMQ's own connect does, so the peer may start later.
func attach(ctx context.Context, sock zmq4.Socket, endpoint string, wg *sync.WaitGroup, log *slog.Logger) error {
	if Binds(endpoint) {
		return sock.Listen(endpoint)
	}
	wg.Go(func() {
		if err := sock.Dial(endpoint); err != nil && ctx.Err() == nil {
			log.Warn("connect failed", "err", err)
		}
	})
	return nil
}

// socketOptions are the options of a socket on endpoint: a connecting
// socket retries until closed and reconnects when its peer goes away (what
// libzmq does by default); a binding one must not get them, because zmq4
// then "reconnects" a listener by dialing its own wildcard address.
func socketOptions(endpoint string) []zmq4.Option {
	opts := []zmq4.Option{zmq4.WithLogger(quietLogger())}
	if !Binds(endpoint) {
		opts = append(opts, zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
	}
	return opts
}

// quietLogger silences zmq4's own logger (it prints to stderr by default);
// errors that matter come back as values.
func quietLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// dialable turns a bound tcp endpoint into one a local client can dial:
// the listener's port (so port 0 resolves), a loopback host for a wildcard.
func dialable(endpoint string, addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok || !strings.HasPrefix(endpoint, "tcp://") {
		return endpoint
	}
	host := "127.0.0.1"
	if !ta.IP.IsUnspecified() {
		host = ta.IP.String()
	} else if ta.IP.To4() == nil && strings.Contains(endpoint, "::") {
		host = "::1"
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(ta.Port))
}

// closeSocket closes sock. zmq4 closes a departed peer's connection itself
// and drops it from the socket only later, so Close may meet a connection
// that is already closed and report net.ErrClosed; nothing is lost then,
// so that is not an error of the caller's close.
func closeSocket(sock zmq4.Socket) error {
	if err := sock.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
