package vllmzmq

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
)

// Message is one frame set of vLLM's event stream: the topic, the seq and
// the payload (one msgpack KVEventBatch, for kvevents/vllm.DecodeBatch).
type Message struct {
	Topic   string
	Seq     uint64
	Payload []byte
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Endpoint of the engine's PUB socket. It is bound or connected by the
	// same rule as the engine's (Binds): tcp://host:port connects (the
	// usual case), a wildcard host binds (llm-d's centralized mode, where
	// engines connect to the subscriber).
	Endpoint string
	// Topic is the subscription prefix; "" receives every topic.
	Topic string
	// Buffer is how many messages may wait for Recv (default 1024).
	Buffer int
	Logger *slog.Logger // nil discards
}

// Subscriber is a SUB socket on one engine rank's event stream. Messages
// that are not [topic, 8-byte seq, payload] are counted (Malformed) and
// skipped. It does not order or deduplicate: a client compares each seq with
// the one it expects and uses Replay to fill a gap (see the package doc).
type Subscriber struct {
	endpoint  string
	sock      zmq4.Socket
	stop      context.CancelFunc
	ctx       context.Context
	msgs      chan Message
	malformed atomic.Uint64
	log       *slog.Logger
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// NewSubscriber opens a SUB socket on cfg.Endpoint subscribed to cfg.Topic.
// A connect is retried in the background until Close, so the engine may
// start later.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if _, _, err := splitEndpoint(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("%w: subscriber: %v", ErrBadConfig, err)
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Subscriber{
		endpoint: cfg.Endpoint, stop: stop, ctx: ctx, msgs: make(chan Message, cfg.Buffer),
		log: cfg.Logger.With("component", "vllmzmq.subscriber", "endpoint", cfg.Endpoint),
	}
	s.sock = zmq4.NewSub(ctx, socketOptions(cfg.Endpoint)...)
	if err := s.sock.SetOption(zmq4.OptionSubscribe, cfg.Topic); err != nil {
		s.Close()
		return nil, fmt.Errorf("vllmzmq: subscribe %q: %w", cfg.Topic, err)
	}
	if err := attach(ctx, s.sock, cfg.Endpoint, &s.wg, s.log); err != nil {
		s.Close()
		return nil, fmt.Errorf("vllmzmq: bind SUB: %w", err)
	}
	s.wg.Go(s.read)
	return s, nil
}

// Endpoint returns where engines reach the subscriber when it bound (port
// 0 resolved), else its configured endpoint.
func (s *Subscriber) Endpoint() string { return dialable(s.endpoint, s.sock.Addr()) }

func (s *Subscriber) read() {
	for {
		msg, err := s.sock.Recv()
		if s.ctx.Err() != nil {
			return
		}
		if err != nil {
			// One connection ended (the engine went away); the socket
			// reconnects, so keep reading.
			s.log.Debug("SUB receive", "err", err)
			continue
		}
		m, err := parseMessage(msg.Frames)
		if err != nil {
			s.malformed.Add(1)
			s.log.Warn("skipping malformed event message", "err", err)
			continue
		}
		select {
		case s.msgs <- m:
		case <-s.ctx.Done():
			return
		}
	}
}

// parseMessage checks vLLM's three frames.
func parseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("%d frames, want 3 (topic, seq, payload)", len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, fmt.Errorf("seq frame of %d bytes, want 8", len(frames[1]))
	}
	return Message{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1]), Payload: frames[2]}, nil
}

// Recv returns the next message, or ctx's error, or ErrClosed after Close.
func (s *Subscriber) Recv(ctx context.Context) (Message, error) {
	select {
	case m := <-s.msgs:
		return m, nil
	case <-ctx.Done():
		return Message{}, ctx.Err()
	case <-s.ctx.Done():
		return Message{}, ErrClosed
	}
}

// Malformed returns how many messages were skipped as malformed.
func (s *Subscriber) Malformed() uint64 { return s.malformed.Load() }

// Close closes the socket and stops the reader.
func (s *Subscriber) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.stop()
		err = closeSocket(s.sock)
		s.wg.Wait()
	})
	return err
}

// ReplayResult is the answer to one replay request.
type ReplayResult struct {
	From    uint64    // the seq asked for
	Batches []Message // every buffered batch with seq >= From, in order
	// Late reports that the first batch returned has a seq above From: the
	// batches in between have left the engine's buffer (buffer_steps), so
	// what they said is lost and the client must rebuild this rank's state
	// from scratch (clear it and apply what follows).
	Late bool
}

// Replay asks the replay socket at endpoint for every buffered batch from
// seq from and returns them once the end marker arrives (or ctx ends). It
// uses a DEALER that sends vLLM's request [empty delimiter, 8-byte
// big-endian seq], so it works against vLLM itself, and accepts both of
// vLLM's reply shapes: [seq, payload] (older vLLM, SGLang) and [topic, seq,
// payload] (current vLLM, TensorRT-LLM); the end is a seq of -1 or an
// empty payload.
func Replay(ctx context.Context, endpoint string, from uint64) (ReplayResult, error) {
	if _, _, err := splitEndpoint(endpoint); err != nil {
		return ReplayResult{}, fmt.Errorf("%w: replay: %v", ErrBadConfig, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewDealer(ctx, zmq4.WithLogger(quietLogger()))
	defer sock.Close()
	if err := sock.Dial(endpoint); err != nil {
		return ReplayResult{}, fmt.Errorf("vllmzmq: replay dial %s: %w", endpoint, err)
	}
	req := zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, from))
	if err := sock.SendMulti(req); err != nil {
		return ReplayResult{}, fmt.Errorf("vllmzmq: replay request to %s: %w", endpoint, err)
	}
	res := ReplayResult{From: from}
	for {
		msg, err := sock.Recv()
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("vllmzmq: replay from %s after %d batches: %w", endpoint, len(res.Batches), err)
		}
		if err != nil {
			return res, fmt.Errorf("vllmzmq: replay from %s after %d batches: %w", endpoint, len(res.Batches), err)
		}
		m, end, err := parseReply(msg.Frames)
		if err != nil {
			return res, fmt.Errorf("vllmzmq: replay from %s after %d batches: %w", endpoint, len(res.Batches), err)
		}
		if end {
			res.Late = len(res.Batches) > 0 && res.Batches[0].Seq > from
			return res, nil
		}
		res.Batches = append(res.Batches, m)
	}
}

// parseReply reads one reply: the delimiter (the request had one), then
// [seq, payload] or [topic, seq, payload]; end reports the end marker.
func parseReply(frames [][]byte) (m Message, end bool, err error) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	switch len(frames) {
	case 2:
		frames = append([][]byte{nil}, frames...)
	case 3:
	default:
		return Message{}, false, fmt.Errorf("reply of %d frames after the delimiter, want 2 or 3", len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, false, fmt.Errorf("reply seq frame of %d bytes, want 8", len(frames[1]))
	}
	if len(frames[2]) == 0 || string(frames[1]) == string(endSeq) {
		return Message{}, true, nil
	}
	return Message{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1]), Payload: frames[2]}, false, nil
}
