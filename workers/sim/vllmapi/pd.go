package vllmapi

// Prefill/decode disaggregation, as vLLM's NixlConnector and SGLang's
// disaggregation mode speak it (docs/pd.md; the protocol facts are in
// ../shared/reference/protocols-engines-gateways.md, section 5). The
// simulator moves no KV: a decode engine takes the prompt blocks the
// prefill engine names as computed (sim.Request.Transferred) after waiting
// the time the transfer would take, and publishes them as its own.

import (
	"context"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/workers/sim"
)

// KVTransferConfig is the engine's --kv-transfer-config (vLLM) and the
// transfer model. A nil *KVTransferConfig in Config means no connector:
// kv_transfer_params are ignored, as vLLM ignores them then.
type KVTransferConfig struct {
	Connector string `json:"kv_connector"` // NixlConnector (the only one simulated)
	Role      string `json:"kv_role"`      // kv_producer, kv_consumer, kv_both: NixlConnector ignores it, so does the simulator
	// EngineID names the engine in the kv_transfer_params it returns
	// (remote_engine_id); Host and Port are its side channel (vLLM's
	// VLLM_NIXL_SIDE_CHANNEL_HOST and _PORT, default localhost:5600).
	EngineID string `json:"engine_id"`
	Host     string `json:"-"`
	Port     int    `json:"-"`
	// BandwidthGBps and BlockBytes model a transfer: blocks × BlockBytes /
	// (BandwidthGBps × 10⁹) seconds of model time (then divided by the
	// engine's speed-up), plus Latency.
	BandwidthGBps float64       `json:"-"`
	BlockBytes    int64         `json:"-"`
	Latency       time.Duration `json:"-"`
}

// Defaults of the transfer model: an 8B model's 16-token block in bf16 is
// 2 MiB; 25 GB/s is one 200 Gb/s NIC; 1 ms of handshake.
const (
	DefaultTransferGBps       = 25
	DefaultTransferBlockBytes = 2 << 20
	DefaultTransferLatency    = time.Millisecond
	DefaultSideChannelPort    = 5600
)

// kvTransferParams is vLLM's kv_transfer_params, both directions.
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int32 `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	RemoteRequestID string  `json:"remote_request_id,omitempty"`
	TPSize          int     `json:"tp_size,omitempty"`
}

// disaggFields are the request fields of both protocols.
type disaggFields struct {
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
	BootstrapHost    *string           `json:"bootstrap_host"`
	BootstrapPort    *int              `json:"bootstrap_port"`
	BootstrapRoom    *uint64           `json:"bootstrap_room"`
}

// withDefaults fills the transfer model's defaults.
func (c KVTransferConfig) withDefaults() KVTransferConfig {
	if c.Host == "" {
		c.Host = "localhost"
	}
	if c.Port == 0 {
		c.Port = DefaultSideChannelPort
	}
	if c.BandwidthGBps == 0 {
		c.BandwidthGBps = DefaultTransferGBps
	}
	if c.BlockBytes == 0 {
		c.BlockBytes = DefaultTransferBlockBytes
	}
	if c.Latency == 0 {
		c.Latency = DefaultTransferLatency
	}
	return c
}

// transferTime is the wall time of pulling n blocks.
func (s *Server) transferTime(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	c := s.transfer
	model := c.Latency + time.Duration(float64(n)*float64(c.BlockBytes)/(c.BandwidthGBps*1e9)*float64(time.Second))
	return time.Duration(float64(model) / s.eng.Config().Speedup)
}

// prepareDisagg reads j's disaggregation fields: a vLLM prefill leg
// (do_remote_decode) is marked to answer with kv_transfer_params; a vLLM
// decode leg (do_remote_prefill) or an SGLang decode leg pulls its blocks
// (pullBlocks) before it is submitted.
func (s *Server) prepareDisagg(ctx context.Context, j *job, d *disaggFields) *Error {
	if s.cfg.Disaggregation != "" {
		return s.prepareBootstrap(ctx, j, d)
	}
	p := d.KVTransferParams
	if s.transfer == nil || p == nil {
		return nil
	}
	switch {
	case p.DoRemoteDecode:
		if j.stream {
			return badRequest("kv_transfer_params.do_remote_decode needs a non-streaming request")
		}
		j.remoteDecode = true
	case p.DoRemotePrefill:
		if p.RemoteEngineID == nil || p.RemoteBlockIDs == nil || p.RemoteHost == nil || p.RemotePort == nil {
			return badRequest("kv_transfer_params with do_remote_prefill needs remote_engine_id, remote_block_ids, remote_host and remote_port")
		}
		return s.pullBlocks(ctx, j, len(p.RemoteBlockIDs))
	}
	return nil
}

// pullBlocks waits the transfer time of the prompt blocks the prefill
// engine holds (remote) less those this engine holds already, and sets
// j.transferred.
func (s *Server) pullBlocks(ctx context.Context, j *job, remote int) *Error {
	held, err := s.eng.HeldPrefix(j.simRequest())
	if err != nil {
		return internal("%v", err)
	}
	n := max(0, remote-len(held))
	j.transferred = remote
	s.metrics.transferred(j.rank, n)
	t := time.NewTimer(s.transferTime(n))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return badRequest("request cancelled during the KV transfer: %v", ctx.Err())
	}
}

// transferParams is what a prefill leg answers with: the blocks it holds,
// where to pull them from.
func (s *Server) transferParams(j job) *kvTransferParams {
	ids, err := s.eng.HeldPrefix(j.simRequest())
	if err != nil {
		s.log.Warn("kv_transfer_params: held blocks", "request", j.id, "err", err)
	}
	if ids == nil {
		ids = []int32{}
	}
	c := s.transfer
	id, host, port := c.EngineID, c.Host, c.Port
	return &kvTransferParams{DoRemotePrefill: true, RemoteEngineID: &id, RemoteBlockIDs: ids, RemoteHost: &host,
		RemotePort: &port, RemoteRequestID: j.id, TPSize: 1}
}

// simRequest is j as the engine takes it.
func (j job) simRequest() sim.Request {
	return sim.Request{ID: j.id, Tokens: j.tokens, Media: j.media, MaxTokens: j.maxTokens, Rank: j.rank, Vocab: fillerVocab,
		LoRA: j.lora, LoRAID: j.loraID, CacheSalt: j.salt, Transferred: j.transferred}
}

// checkDisaggConfig validates the disaggregation settings of cfg.
func checkDisaggConfig(cfg *Config) error {
	switch cfg.Disaggregation {
	case "", DisaggPrefill, DisaggDecode:
	default:
		return fmt.Errorf("vllmapi: disaggregation mode %q: want %q or %q", cfg.Disaggregation, DisaggPrefill, DisaggDecode)
	}
	if c := cfg.KVTransfer; c != nil && c.Connector != "NixlConnector" {
		return fmt.Errorf("vllmapi: kv_connector %q: the simulator speaks NixlConnector only", c.Connector)
	}
	return nil
}
