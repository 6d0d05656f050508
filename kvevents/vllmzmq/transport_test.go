package vllmzmq

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// zmq4's parked goroutines behind closed sockets (testutil.IgnoreZMQ4);
	// everything else must stop.
	goleak.VerifyTestMain(m, testutil.IgnoreZMQ4()...)
}

// testConfig is an enabled config on ephemeral loopback-reachable ports.
func testConfig(bufferSteps int, topic string) Config {
	cfg := DefaultConfig()
	cfg.EnableKVCacheEvents = true
	cfg.Endpoint, cfg.ReplayEndpoint = "tcp://*:0", "tcp://*:0"
	cfg.BufferSteps, cfg.Topic = bufferSteps, topic
	return cfg
}

func newPublisher(t testing.TB, cfg Config, rank int) *Publisher {
	t.Helper()
	p, err := NewPublisher(cfg, rank, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newSubscriber(t testing.TB, endpoint, topic string) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(SubscriberConfig{Endpoint: endpoint, Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitSubscribed waits until the publisher has n subscriptions: PUB/SUB
// drops what is sent before the subscription arrives (ZeroMQ's slow joiner).
func waitSubscribed(t testing.TB, p *Publisher, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool { return len(p.Subscriptions()) >= n },
		func() string { return fmt.Sprintf("subscriptions %q, want %d", p.Subscriptions(), n) })
}

func recv(t testing.TB, s *Subscriber) Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.Recv(ctx)
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return m
}

func payload(i int) []byte { return []byte(fmt.Sprintf("batch-%03d", i)) }

// TestPublishSubscribeFrames: three frames per batch, seq from 0, the topic
// as sent, and topic-prefix filtering.
func TestPublishSubscribeFrames(t *testing.T) {
	p := newPublisher(t, testConfig(16, "kv@pod-1@m"), 0)
	match := newSubscriber(t, p.Endpoint(), "kv@pod-1")
	other := newSubscriber(t, p.Endpoint(), "kv@pod-2")
	waitSubscribed(t, p, 2)
	for i := 0; i < 3; i++ {
		seq, err := p.Publish(payload(i))
		if err != nil || seq != uint64(i) {
			t.Fatalf("Publish %d: seq %d, %v", i, seq, err)
		}
	}
	for i := 0; i < 3; i++ {
		m := recv(t, match)
		if m.Topic != "kv@pod-1@m" || m.Seq != uint64(i) || !bytes.Equal(m.Payload, payload(i)) {
			t.Fatalf("message %d: %+v", i, m)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if m, err := other.Recv(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("subscriber of another topic got %+v, %v", m, err)
	}
	if st := p.Stats(); st.Published != 3 || p.NextSeq() != 3 {
		t.Fatalf("stats %+v next %d", st, p.NextSeq())
	}
}

// TestReplay: every buffered batch from the asked seq, in order; a seq
// older than the buffer starts later and says so (Late); after Restart the
// seq starts over and the old batches are gone.
func TestReplay(t *testing.T) {
	p := newPublisher(t, testConfig(5, "t"), 0)
	for i := 0; i < 8; i++ {
		if _, err := p.Publish(payload(i)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		from uint64
		want []uint64
		late bool
	}{
		{0, []uint64{3, 4, 5, 6, 7}, true},
		{2, []uint64{3, 4, 5, 6, 7}, true},
		{3, []uint64{3, 4, 5, 6, 7}, false},
		{6, []uint64{6, 7}, false},
		{8, nil, false},
	} {
		res, err := Replay(ctx, p.ReplayEndpoint(), tc.from)
		if err != nil {
			t.Fatalf("replay from %d: %v", tc.from, err)
		}
		var seqs []uint64
		for _, m := range res.Batches {
			seqs = append(seqs, m.Seq)
			if m.Topic != "t" || !bytes.Equal(m.Payload, payload(int(m.Seq))) {
				t.Fatalf("replay from %d: batch %+v", tc.from, m)
			}
		}
		if !slices.Equal(seqs, tc.want) || res.Late != tc.late || res.From != tc.from {
			t.Fatalf("replay from %d: seqs %v late %v, want %v late %v", tc.from, seqs, res.Late, tc.want, tc.late)
		}
	}
	p.Restart()
	if seq, _ := p.Publish(payload(0)); seq != 0 {
		t.Fatalf("first seq after Restart %d", seq)
	}
	res, err := Replay(ctx, p.ReplayEndpoint(), 0)
	if err != nil || len(res.Batches) != 1 || res.Batches[0].Seq != 0 || res.Late {
		t.Fatalf("replay after restart: %+v, %v", res, err)
	}
}

// TestReplayWireShapes talks to the ROUTER with a raw DEALER: the request
// with vLLM's empty delimiter gets vLLM's current reply shape, delimiter
// included; a bare request gets the same frames without it; a malformed
// request is counted and ignored, and the socket goes on serving.
func TestReplayWireShapes(t *testing.T) {
	p := newPublisher(t, testConfig(4, "topic"), 0)
	for i := 0; i < 2; i++ {
		p.Publish(payload(i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(quietLogger()))
	defer d.Close()
	if err := d.Dial(p.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	be := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	expect := func(want ...[]byte) {
		t.Helper()
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != len(want) {
			t.Fatalf("frames %q, want %q", msg.Frames, want)
		}
		for i := range want {
			if !bytes.Equal(msg.Frames[i], want[i]) {
				t.Fatalf("frame %d: %q, want %q", i, msg.Frames[i], want[i])
			}
		}
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, be(1))); err != nil {
		t.Fatal(err)
	}
	expect(nil, []byte("topic"), be(1), payload(1))
	expect(nil, nil, endSeq, nil)

	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{1, 2, 3, 4})); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return p.Stats().BadReplayRequests == 1 },
		func() string { return fmt.Sprintf("stats %+v", p.Stats()) })

	if err := d.Send(zmq4.NewMsg(be(0))); err != nil {
		t.Fatal(err)
	}
	expect([]byte("topic"), be(0), payload(0))
	expect([]byte("topic"), be(1), payload(1))
	expect(nil, endSeq, nil)
	// A replay is counted once its end marker is sent, which may be just
	// after the client has read it.
	testutil.Eventually(t, 10*time.Second, func() bool {
		st := p.Stats()
		return st.Replays == 2 && st.ReplayedBatches == 3
	}, func() string { return fmt.Sprintf("stats %+v, want 2 replays of 3 batches", p.Stats()) })
}

func TestParseReply(t *testing.T) {
	seq7 := binary.BigEndian.AppendUint64(nil, 7)
	for _, tc := range []struct {
		name   string
		frames [][]byte
		want   Message
		end    bool
		err    bool
	}{
		{"current shape", [][]byte{nil, []byte("tp"), seq7, []byte("x")}, Message{"tp", 7, []byte("x")}, false, false},
		{"original shape", [][]byte{nil, seq7, []byte("x")}, Message{"", 7, []byte("x")}, false, false},
		{"current end marker", [][]byte{nil, nil, endSeq, nil}, Message{}, true, false},
		{"original end marker", [][]byte{nil, endSeq, nil}, Message{}, true, false},
		{"empty payload ends", [][]byte{nil, []byte("tp"), seq7, nil}, Message{}, true, false},
		{"short seq", [][]byte{nil, []byte("tp"), seq7[:4], []byte("x")}, Message{}, false, true},
		{"too many frames", [][]byte{nil, nil, nil, seq7, []byte("x")}, Message{}, false, true},
		{"one frame", [][]byte{seq7}, Message{}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, end, err := parseReply(tc.frames)
			if (err != nil) != tc.err || end != tc.end || m.Topic != tc.want.Topic || m.Seq != tc.want.Seq || !bytes.Equal(m.Payload, tc.want.Payload) {
				t.Fatalf("got %+v end %v err %v", m, end, err)
			}
		})
	}
}

// TestConnectMode: an endpoint without a wildcard host is connected to, so
// engines can publish into one SUB that a scheduler binds (llm-d's
// centralized mode); the engine may start before the subscriber.
func TestConnectMode(t *testing.T) {
	sub := newSubscriber(t, "tcp://*:0", "")
	cfg := testConfig(4, "")
	cfg.Endpoint, cfg.ReplayEndpoint = sub.Endpoint(), ""
	if Binds(cfg.Endpoint) {
		t.Fatalf("%s would bind", cfg.Endpoint)
	}
	p := newPublisher(t, cfg, 0)
	waitSubscribed(t, p, 1)
	p.Publish(payload(0))
	if m := recv(t, sub); m.Seq != 0 || !bytes.Equal(m.Payload, payload(0)) {
		t.Fatalf("got %+v", m)
	}
	if p.ReplayEndpoint() != "" {
		t.Fatal("replay endpoint without a configured one")
	}
}

// TestSubscriberCountsMalformed: frames that are not [topic, 8-byte seq,
// payload] are counted and skipped; the next good one is delivered.
func TestSubscriberCountsMalformed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(quietLogger()))
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	sub := newSubscriber(t, dialable("tcp://127.0.0.1:0", pub.Addr()), "")
	testutil.Eventually(t, 10*time.Second, func() bool { return len(pub.(zmq4.Topics).Topics()) > 0 }, nil)
	for _, m := range []zmq4.Msg{
		zmq4.NewMsgFrom([]byte("t"), []byte("only two")),
		zmq4.NewMsgFrom([]byte("t"), []byte{0, 1, 2, 3}, []byte("short seq")),
		zmq4.NewMsgFrom([]byte("t"), binary.BigEndian.AppendUint64(nil, 9), []byte("good")),
	} {
		if err := pub.SendMulti(m); err != nil {
			t.Fatal(err)
		}
	}
	if m := recv(t, sub); m.Seq != 9 || string(m.Payload) != "good" {
		t.Fatalf("got %+v", m)
	}
	if sub.Malformed() != 2 {
		t.Fatalf("malformed %d, want 2", sub.Malformed())
	}
}

func TestNewPublisherRejects(t *testing.T) {
	if _, err := NewPublisher(DefaultConfig(), 0, nil); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("disabled config: %v", err)
	}
	cfg := testConfig(4, "")
	cfg.Publisher = "kafka"
	if _, err := NewPublisher(cfg, 0, nil); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("unknown publisher: %v", err)
	}
	p := newPublisher(t, testConfig(4, ""), 0)
	addr := p.Endpoint() // a port in use: the second bind must fail
	cfg = testConfig(4, "")
	cfg.Endpoint = "tcp://*:" + addr[len("tcp://127.0.0.1:"):]
	if _, err := NewPublisher(cfg, 0, nil); err == nil {
		t.Fatalf("second bind of %s succeeded", cfg.Endpoint)
	}
	p.Close()
	if _, err := p.Publish(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
}

// TestCloseAfterPeersLeft: a publisher whose subscribers went away first
// (a bridge stops before its engine) closes without an error. zmq4 closes
// a dead peer's connection on its own and forgets it only later, so the
// socket's Close may meet connections that are already closed; that loses
// nothing and is not the caller's failure.
func TestCloseAfterPeersLeft(t *testing.T) {
	for i := range 20 {
		p, err := NewPublisher(testConfig(16, "kv"), 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		var subs []*Subscriber
		for k := range 3 {
			s, err := NewSubscriber(SubscriberConfig{Endpoint: p.Endpoint(), Topic: fmt.Sprintf("kv%d", k)})
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, s)
		}
		waitSubscribed(t, p, 3)
		for _, s := range subs {
			s.Close()
		}
		// The publisher learns of the closed peers on its next write.
		for j := range 3 {
			p.Publish(payload(j))
		}
		if err := p.Close(); err != nil {
			t.Fatalf("round %d: Close after the subscribers left: %v", i, err)
		}
	}
}
