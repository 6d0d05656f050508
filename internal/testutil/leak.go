package testutil

import "go.uber.org/goleak"

// IgnoredGoroutines are the goroutines a package's goleak check may find
// that are not its own leaks, one list for every TestMain:
//   - the embedded nats-server's shutdown leaves startGoRoutine helpers
//     behind for a moment;
//   - HTTP transports keep idle keep-alive connections (their read and
//     write loops, parked in the poller);
//   - zmq4 v0.17.0 leaves parked goroutines behind a closed socket (IgnoreZMQ4).
func IgnoredGoroutines() []goleak.Option {
	return append(IgnoreZMQ4(),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"),
		IgnoreNATSAsyncReply(),
	)
}

// IgnoreZMQ4 ignores the goroutines zmq4 v0.17.0 leaves parked, without
// CPU, behind a closed socket: a PUB socket's writer (Close never stops
// it), and a SUB socket's connection reader that had read a message when
// the socket closed (it blocks for good sending it to a channel no one
// reads; seen in workers/sim's benchmarks), and a PUB socket's reader of
// a connection neither socket's Close reached: zmq4 lists a connection
// dialled or accepted during Close after Close has closed the listed ones,
// so both ends stay open and the reader waits in the poller (seen once in
// kvevents/vllmzmq under load).
// Every package whose tests open ZMQ sockets needs it.
func IgnoreZMQ4() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*qreader).listen"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubQReader).listen"),
	}
}

// IgnoreNATSAsyncReply ignores nats.go v1.55's async-publish reply handler:
// once the connection is closed it can be left blocked on a nil channel
// (seen in CI). Every package whose tests publish to JetStream needs it.
func IgnoreNATSAsyncReply() goleak.Option {
	return goleak.IgnoreAnyFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect")
}
