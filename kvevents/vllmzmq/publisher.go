package vllmzmq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ErrClosed: the publisher or subscriber was closed.
var ErrClosed = errors.New("vllmzmq: closed")

// endSeq is vLLM's END_SEQ, (-1).to_bytes(8, "big", signed=True): the seq
// frame of the replay's end marker.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// PublisherStats are a Publisher's counters since NewPublisher.
type PublisherStats struct {
	Published         uint64 // batches handed to the PUB socket
	SendErrors        uint64 // batches the PUB socket refused (kept for replay)
	Restarts          uint64 // Restart calls (seq back to 0)
	Replays           uint64 // replay requests answered
	ReplayedBatches   uint64 // batches sent in answers
	BadReplayRequests uint64 // replay requests of the wrong shape, ignored as vLLM does
}

// Publisher is vLLM's ZmqEventPublisher for one data-parallel rank: a PUB
// socket that sends every batch as [topic, seq (8 bytes big-endian), payload]
// with seq from 0, and, when a replay endpoint is configured, a ROUTER socket
// that answers a start seq with every buffered batch from there and then the
// end marker. Safe for concurrent use.
type Publisher struct {
	cfg   Config // this rank's (endpoints already offset)
	rank  int
	log   *slog.Logger
	topic []byte

	pub    zmq4.Socket
	replay zmq4.Socket // nil without a replay endpoint
	stop   context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	next   uint64  // seq of the next batch
	ring   []entry // the last BufferSteps batches, oldest at head once full
	head   int
	closed bool
	stats  PublisherStats
}

type entry struct {
	seq     uint64
	payload []byte
}

// NewPublisher opens the sockets of data-parallel rank rank: cfg's
// endpoints moved by ForRank, the PUB endpoint bound or connected by Binds
// (a connect is retried in the background until Close, as ZeroMQ does), the
// replay endpoint bound. cfg must be enabled (Config.Enabled). log nil
// discards.
func NewPublisher(cfg Config, rank int, log *slog.Logger) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, fmt.Errorf("%w: publisher %q: events are not enabled", ErrBadConfig, cfg.PublisherName())
	}
	cfg, err := cfg.ForRank(rank)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Publisher{
		cfg: cfg, rank: rank, topic: []byte(cfg.Topic), stop: stop,
		log: log.With("component", "vllmzmq.publisher", "rank", rank, "endpoint", cfg.Endpoint),
	}
	p.pub = zmq4.NewPub(ctx, socketOptions(cfg.Endpoint)...)
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		p.Close()
		return nil, fmt.Errorf("vllmzmq: hwm %d: %w", cfg.HWM, err)
	}
	if err := attach(ctx, p.pub, cfg.Endpoint, &p.wg, p.log); err != nil {
		p.Close()
		return nil, fmt.Errorf("vllmzmq: bind PUB rank %d: %w", rank, err)
	}
	if cfg.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx, zmq4.WithLogger(quietLogger()))
		if err := p.replay.Listen(cfg.ReplayEndpoint); err != nil {
			p.Close()
			return nil, fmt.Errorf("vllmzmq: bind replay ROUTER rank %d: %w", rank, err)
		}
		p.wg.Go(func() { p.serveReplay(ctx) })
	}
	return p, nil
}

// Endpoint returns where a subscriber reaches the PUB socket: the
// configured endpoint, or for a bound tcp endpoint the bound port on a
// loopback host (so port 0 resolves to the port the system chose).
func (p *Publisher) Endpoint() string { return dialable(p.cfg.Endpoint, p.pub.Addr()) }

// ReplayEndpoint returns where a client reaches the replay socket, as
// Endpoint does; "" without one.
func (p *Publisher) ReplayEndpoint() string {
	if p.replay == nil {
		return ""
	}
	return dialable(p.cfg.ReplayEndpoint, p.replay.Addr())
}

// Publish sends payload (one encoded KVEventBatch) as the next seq, keeps
// it for replay, and returns its seq. The publisher owns payload from now
// on: the caller must not modify it. A batch the PUB socket refuses still
// takes its seq and stays replayable (subscribers see a gap and replay it),
// as in vLLM.
func (p *Publisher) Publish(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	seq := p.next
	p.next++
	p.keep(seq, payload)
	seqb := binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, seqb, payload)); err != nil {
		p.stats.SendErrors++
		return seq, fmt.Errorf("vllmzmq: rank %d seq %d: %w", p.rank, seq, err)
	}
	p.stats.Published++
	return seq, nil
}

// keep puts a batch in the replay ring, dropping the oldest when full.
func (p *Publisher) keep(seq uint64, payload []byte) {
	if p.replay == nil {
		return
	}
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, entry{seq, payload})
		return
	}
	p.ring[p.head] = entry{seq, payload}
	p.head = (p.head + 1) % len(p.ring)
}

// Restart starts the seq over at 0 and empties the replay ring, as a new
// engine process would (the sockets stay open: subscribers keep their
// connection and see the seq go down, which tells them the cache is empty).
func (p *Publisher) Restart() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next = 0
	p.ring, p.head = p.ring[:0], 0
	p.stats.Restarts++
}

// NextSeq returns the seq the next batch will get (the number of batches
// published since the last start).
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// Subscriptions returns the topic prefixes connected subscribers asked for
// (sorted, each once); empty while nobody is subscribed.
func (p *Publisher) Subscriptions() []string {
	if t, ok := p.pub.(zmq4.Topics); ok {
		return t.Topics()
	}
	return nil
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close closes both sockets and waits for the replay server. Later calls
// return nil.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.stop()
	var errs []error
	if err := closeSocket(p.pub); err != nil {
		errs = append(errs, err)
	}
	if p.replay != nil {
		if err := closeSocket(p.replay); err != nil {
			errs = append(errs, err)
		}
	}
	p.wg.Wait()
	return errors.Join(errs...)
}

// serveReplay answers replay requests until ctx ends.
func (p *Publisher) serveReplay(ctx context.Context) {
	for {
		msg, err := p.replay.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.log.Debug("replay receive", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.answer(msg.Frames)
	}
}

// answer serves one request. The ROUTER prepends the client's identity. A
// REQ client (or a DEALER that imitates one, as vLLM's own clients do) sends
// [empty delimiter, start seq]; a bare DEALER sends [start seq]. The reply
// is vLLM's current shape, with the delimiter when the request had one:
// [topic, seq, payload] per buffered batch with seq >= start, then
// [b"", END_SEQ, b""].
func (p *Publisher) answer(frames [][]byte) {
	var id, start []byte
	delim := false
	switch {
	case len(frames) == 3 && len(frames[1]) == 0 && len(frames[2]) == 8:
		id, start, delim = frames[0], frames[2], true
	case len(frames) == 2 && len(frames[1]) == 8:
		id, start = frames[0], frames[1]
	default:
		p.mu.Lock()
		p.stats.BadReplayRequests++
		p.mu.Unlock()
		sizes := make([]int, len(frames))
		for i, f := range frames {
			sizes[i] = len(f)
		}
		p.log.Warn("ignoring replay request: want [delimiter,] 8-byte big-endian start seq", "frame_sizes", sizes)
		return
	}
	from := binary.BigEndian.Uint64(start)
	batches := p.since(from)
	head := [][]byte{id}
	if delim {
		head = append(head, nil)
	}
	send := func(frames ...[]byte) error {
		return p.replay.SendMulti(zmq4.NewMsgFrom(append(head[:len(head):len(head)], frames...)...))
	}
	for _, b := range batches {
		if err := send(p.topic, binary.BigEndian.AppendUint64(nil, b.seq), b.payload); err != nil {
			// The client went away (zmq4 reports it here, not at Recv).
			p.log.Debug("replay send", "err", err, "seq", b.seq)
			return
		}
	}
	if err := send(nil, endSeq, nil); err != nil {
		p.log.Debug("replay end marker", "err", err)
		return
	}
	p.mu.Lock()
	p.stats.Replays++
	p.stats.ReplayedBatches += uint64(len(batches))
	p.mu.Unlock()
}

// since returns the buffered batches with seq >= from, oldest first.
func (p *Publisher) since(from uint64) []entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []entry
	for i := range p.ring {
		e := p.ring[(p.head+i)%len(p.ring)]
		if e.seq >= from {
			out = append(out, e)
		}
	}
	return out
}
