package bridge

import (
	"context"
	"encoding/hex"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
)

// pyPublisher binds a libzmq PUB socket (pyzmq) and sends vLLM's frames,
// [topic, 8-byte big-endian seq, payload], for each payload in turn,
// repeating the whole run (seq going on) until killed, so a late SUB
// still gets messages.
const pyPublisher = `
import sys, time, zmq
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub.bind("tcp://127.0.0.1:" + sys.argv[1])
payloads = [bytes.fromhex(h) for h in sys.argv[2:]]
seq = 0
while True:
    for p in payloads:
        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), p])
        seq += 1
        time.sleep(0.01)
`

// The bridge's SUB (go-zeromq) reads what the C libzmq implementation, as
// real engines use it, publishes.
func TestLibzmqInterop(t *testing.T) {
	python := ""
	for _, p := range []string{"python3", "/usr/bin/python3"} { // pyenv shims may hide Debian's
		if exec.Command(p, "-c", "import zmq").Run() == nil {
			python = p
			break
		}
	}
	if python == "" {
		t.Skip("python3 with pyzmq (Debian: python3-zmq) is not installed: the libzmq interop test is skipped")
	}
	f := newFleet(t)
	r := testRank(t, f, "wz")
	port := testutil.FreePorts(t, 1)
	args := []string{"-c", pyPublisher, strconv.Itoa(port)}
	for i := range 3 {
		args = append(args, hex.EncodeToString(encode(t, []any{1.7e9, []any{stored(uint64(10+i), uint32(1000*i))}, 0})))
	}
	py := exec.Command(python, args...)
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { py.Process.Kill(); py.Wait() }()
	sub, err := vllmzmq.NewSubscriber(vllmzmq.SubscriberConfig{Endpoint: "tcp://127.0.0.1:" + strconv.Itoa(port), Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	r.sub, r.synced = sub, false
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.run(ctx) }()
	defer func() { cancel(); sub.Close(); <-done }()
	testutil.Eventually(t, 10*time.Second, func() bool { return len(f.mirror.seqs(key("wz"))) == 3 },
		func() string {
			return "the 3 blocks libzmq published in the index, have " + strconv.Itoa(len(f.mirror.seqs(key("wz"))))
		})
	if m := sub.Malformed(); m != 0 {
		t.Fatalf("%d libzmq messages malformed", m)
	}
}
