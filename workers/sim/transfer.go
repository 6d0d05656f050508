package sim

// KV transfer between engines (prefill/decode disaggregation, docs/pd.md):
// a decode engine admits a request whose leading prompt blocks arrived
// from a prefill engine (Request.Transferred) as computed, caches them and
// publishes them as Stored, and computes only the rest. Pull models the
// transfer's time, shared by both faces (the NATS endpoint's remote_blocks,
// vllmapi's kv_transfer_params); the faces speak the protocol, the core
// only skips the work.

import (
	"context"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
)

// Defaults of the transfer model: an 8B model's 16-token block in bf16 is
// 2 MiB; 25 GB/s is one 200 Gb/s NIC; 1 ms of handshake.
const (
	DefaultTransferGBps       = 25
	DefaultTransferBlockBytes = 2 << 20
	DefaultTransferLatency    = time.Millisecond
)

// TransferModel is how long a decode engine takes to pull KV blocks from
// a prefill engine: Latency + blocks × BlockBytes / (BandwidthGBps × 10⁹)
// seconds of model time. Zero fields take the defaults above.
type TransferModel struct {
	BandwidthGBps float64
	BlockBytes    int64
	Latency       time.Duration
}

func (m TransferModel) withDefaults() TransferModel {
	if m.BandwidthGBps == 0 {
		m.BandwidthGBps = DefaultTransferGBps
	}
	if m.BlockBytes == 0 {
		m.BlockBytes = DefaultTransferBlockBytes
	}
	if m.Latency == 0 {
		m.Latency = DefaultTransferLatency
	}
	return m
}

func (m TransferModel) validate() error {
	if !(m.BandwidthGBps >= 0) || m.BlockBytes < 0 || m.Latency < 0 {
		return fmt.Errorf("%w: transfer model %+v (want no negative field)", ErrBadConfig, m)
	}
	return nil
}

// Time is the model time of pulling n blocks (0 for none: nothing to
// pull needs no handshake either).
func (m TransferModel) Time(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return m.Latency + time.Duration(float64(n)*float64(m.BlockBytes)/(m.BandwidthGBps*1e9)*float64(time.Second))
}

// Pulled is what a Pull did: the blocks it transferred and the model time
// it took.
type Pulled struct {
	Blocks int
	Time   time.Duration
}

// Pull is a decode leg's KV transfer before req is submitted: of the
// remote leading prompt blocks the prefill engine holds, it pulls those
// this engine does not hold already (HeldPrefix), waiting the transfer
// time (Config.Transfer, divided by the speed-up),
// and sets req.Transferred to remote. It returns early with ctx's error.
func (e *Engine) Pull(ctx context.Context, req *Request, remote int) (Pulled, error) {
	held, err := e.HeldPrefix(*req)
	if err != nil {
		return Pulled{}, err
	}
	n := max(0, remote-len(held))
	p := Pulled{Blocks: n, Time: e.cfg.Transfer.Time(n)}
	req.Transferred = remote
	if p.Time == 0 {
		return p, nil
	}
	// A wall-clock timer, not the engine's clock: a VirtualClock moves
	// with the engine's steps, and the transfer runs beside them.
	t := time.NewTimer(time.Duration(float64(p.Time) / e.cfg.Speedup))
	defer t.Stop()
	select {
	case <-t.C:
		return p, nil
	case <-ctx.Done():
		return p, fmt.Errorf("sim: request %q cancelled during the KV transfer of %d blocks: %w", req.ID, n, ctx.Err())
	}
}

// HeldPrefix returns the physical block ids of the leading full prompt
// blocks of req that rank req.Rank holds in its cache (in use or cached),
// in order: the blocks a prefill engine names to its decode engine, and
// the ones a decode engine need not pull.
func (e *Engine) HeldPrefix(req Request) ([]int32, error) {
	if int(req.Rank) >= len(e.ranks) {
		return nil, fmt.Errorf("%w: rank %d of %d on %s", ErrBadRank, req.Rank, len(e.ranks), e.cfg.Worker)
	}
	c := e.ranks[req.Rank]
	bs := c.cfg.BlockSize
	full := len(req.Tokens) / bs
	hashes := kvevents.SeqHashesMedia(nil, req.Tokens[:full*bs], bs, kvevents.SeedFor(req.LoRA, req.CacheSalt), req.Media)
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int32
	for _, h := range hashes {
		b, ok := c.cache.lookup(h)
		if !ok {
			break
		}
		out = append(out, b)
	}
	return out, nil
}

// transferStart is where r's computation starts at its first admission
// when its prompt's first r.transferred blocks arrived by transfer and the
// cache holds the first hit: after the transferred blocks, but, as vLLM,
// never past the block of the prompt's last token (computed for its
// logits).
func (c *core) transferStart(r *request, hit int) int {
	if r.admitted || r.transferred <= hit {
		return hit
	}
	return max(hit, min(r.transferred, (len(r.tokens)-1)/c.cfg.BlockSize))
}

// adoptTransferred makes r's blocks hit..start, just allocated, computed
// (their KV came from the prefill engine): they are cached and published
// as Stored like blocks the engine computed.
func (c *core) adoptTransferred(r *request, hit, start int) {
	if start <= hit {
		return
	}
	r.computed = start * c.cfg.BlockSize
	c.register(r, hit*c.cfg.BlockSize)
	c.stats.TransferredBlocks += uint64(start - hit)
}
