package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/workers"
)

// Defaults follow the issue (and NVIDIA Dynamo's mocker, except the block
// size, which is 16 here so that router and engine agree with vLLM's default).
const (
	DefaultBlockSize        = 16
	DefaultMooncakeBlock    = 512 // block size to use when replaying Mooncake traces
	DefaultKVBlocks         = 16384
	DefaultMaxBatchedTokens = 8192
	DefaultMaxSeqs          = 256
	DefaultWatermark        = 0.01
	DefaultSpeedup          = 1.0
	DefaultPrefix           = "kvr"
)

// Errors returned by the engine. They are sentinels: test with errors.Is.
var (
	ErrBadConfig        = errors.New("sim: bad config")
	ErrEmptyPrompt      = errors.New("sim: empty prompt")
	ErrBadMaxTokens     = errors.New("sim: max_tokens must be at least 1")
	ErrTooLong          = errors.New("sim: request does not fit in the KV cache")
	ErrBadRank          = errors.New("sim: no such rank")
	ErrDuplicateRequest = errors.New("sim: request id already in flight")
	ErrCancelled        = errors.New("sim: request cancelled")
	ErrRestarted        = errors.New("sim: engine restarted; request dropped")
	ErrClosed           = errors.New("sim: engine closed")
	ErrBusy             = errors.New("sim: engine has requests in flight")
	ErrFutureArrival    = errors.New("sim: arrival after the engine's clock")
	ErrRunning          = errors.New("sim: already running")
)

// Config describes one simulated worker. A worker has Ranks data-parallel
// ranks; each rank owns its own KV cache, scheduler and step loop, and emits
// its own events (the unit the router indexes is workerref.Target).
type Config struct {
	Worker string // worker id (registry key, events subject token)
	Model  string // model name (subjects, registry)
	Prefix string // subject prefix; default "kvr"
	Ranks  int    // data-parallel ranks; default 1

	BlockSize        int     // tokens per KV block; default 16
	KVBlocks         int     // KV blocks per rank; default 16,384
	MaxBatchedTokens int     // token budget of one step; default 8,192
	MaxSeqs          int     // running requests per rank; default 256
	Watermark        float64 // fraction of KV blocks kept free when admitting; default 0.01, negative = 0
	Speedup          float64 // model time runs this many times faster than the clock; default 1

	// SkipOutputBlocks keeps blocks filled by generated tokens out of the
	// prefix cache (and out of events). By default they are cached and
	// stored, as vLLM does.
	SkipOutputBlocks bool

	// MaxLoRAs is how many LoRA adapters a rank holds on its GPU at once
	// (vLLM's --max-loras): a step runs requests of at most that many
	// adapters, the others wait, and a step that needs an adapter not held
	// loads it (least recently used out) for LoRALoadTime of model time.
	// 0: adapters are not modelled (any adapter runs at once, at no cost).
	MaxLoRAs     int
	LoRALoadTime time.Duration

	Timing Timing // zero value = Dynamo mocker polynomial defaults
	Clock  Clock  // nil = wall clock

	// NewEmitter makes the event emitter of one rank for one epoch. It is
	// called at New (epoch 1 of this process) and at every Restart. Nil means
	// events are dropped (DiscardEmitter).
	NewEmitter EmitterFactory

	// NewEpoch returns the epoch of a new incarnation; nil = workers.NewEpoch
	// (random, non-zero, below 2^53).
	NewEpoch func() uint64

	// Role is the worker's part in a prefill/decode-disaggregated fleet, as
	// it registers (Info); "" = both. The engine itself serves any request.
	Role workers.Role
	// Transfer models the KV transfer of a decode leg (Pull); zero fields
	// take the defaults.
	Transfer TransferModel
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Ranks == 0 {
		c.Ranks = 1
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.KVBlocks == 0 {
		c.KVBlocks = DefaultKVBlocks
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if c.MaxSeqs == 0 {
		c.MaxSeqs = DefaultMaxSeqs
	}
	if c.Watermark == 0 {
		c.Watermark = DefaultWatermark
	} else if c.Watermark < 0 {
		c.Watermark = 0
	}
	if c.Speedup == 0 {
		c.Speedup = DefaultSpeedup
	}
	if c.Timing == (Timing{}) {
		c.Timing = DefaultTiming()
	}
	if c.Clock == nil {
		c.Clock = WallClock{}
	}
	if c.NewEpoch == nil {
		c.NewEpoch = workers.NewEpoch
	}
	c.Transfer = c.Transfer.withDefaults()
	return c
}

func (c Config) validate() error {
	switch {
	case c.Worker == "":
		return fmt.Errorf("%w: empty worker id", ErrBadConfig)
	case c.Model == "":
		return fmt.Errorf("%w: empty model", ErrBadConfig)
	case c.Ranks < 1 || c.Ranks > 1024:
		return fmt.Errorf("%w: ranks %d (want 1..1024)", ErrBadConfig, c.Ranks)
	case c.BlockSize < 1:
		return fmt.Errorf("%w: block size %d", ErrBadConfig, c.BlockSize)
	case c.KVBlocks < 2:
		return fmt.Errorf("%w: kv blocks %d (want >= 2)", ErrBadConfig, c.KVBlocks)
	case c.KVBlocks > 1<<30:
		return fmt.Errorf("%w: kv blocks %d (want <= 2^30)", ErrBadConfig, c.KVBlocks)
	case c.MaxBatchedTokens < 1:
		return fmt.Errorf("%w: max batched tokens %d", ErrBadConfig, c.MaxBatchedTokens)
	case c.MaxSeqs < 1:
		return fmt.Errorf("%w: max seqs %d", ErrBadConfig, c.MaxSeqs)
	case !(c.Watermark >= 0 && c.Watermark < 1):
		return fmt.Errorf("%w: watermark %g (want 0 <= w < 1)", ErrBadConfig, c.Watermark)
	case !(c.Speedup > 0):
		return fmt.Errorf("%w: speedup %g (want > 0)", ErrBadConfig, c.Speedup)
	case c.MaxLoRAs < 0 || c.LoRALoadTime < 0:
		return fmt.Errorf("%w: max loras %d, lora load time %v (want >= 0)", ErrBadConfig, c.MaxLoRAs, c.LoRALoadTime)
	case !c.Role.Valid():
		return fmt.Errorf("%w: role %q (want prefill, decode or both)", ErrBadConfig, c.Role)
	}
	return c.Transfer.validate()
}
