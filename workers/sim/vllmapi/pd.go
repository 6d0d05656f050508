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

	"github.com/kvrouter/kvrouter/workers/sim"
)

// KVTransferConfig is the engine's --kv-transfer-config (vLLM). A nil
// *KVTransferConfig in Config means no connector: kv_transfer_params are
// ignored, as vLLM ignores them then. The transfer's time is the engine's
// (sim.Config.Transfer, sim.Engine.Pull), shared with the NATS face.
type KVTransferConfig struct {
	Connector string `json:"kv_connector"` // NixlConnector (the only one simulated)
	Role      string `json:"kv_role"`      // kv_producer, kv_consumer, kv_both: NixlConnector ignores it, so does the simulator
	// EngineID names the engine in the kv_transfer_params it returns
	// (remote_engine_id); Host and Port are its side channel (vLLM's
	// VLLM_NIXL_SIDE_CHANNEL_HOST and _PORT, default localhost:5600).
	EngineID string `json:"engine_id"`
	Host     string `json:"-"`
	Port     int    `json:"-"`
}

// DefaultSideChannelPort is NixlConnector's default side channel port.
const DefaultSideChannelPort = 5600

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

// withDefaults fills the side channel's defaults.
func (c KVTransferConfig) withDefaults() KVTransferConfig {
	if c.Host == "" {
		c.Host = "localhost"
	}
	if c.Port == 0 {
		c.Port = DefaultSideChannelPort
	}
	return c
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

// pullBlocks pulls the prompt blocks the prefill engine holds (remote)
// less those this engine holds already (sim.Engine.Pull) and sets
// j.transferred.
func (s *Server) pullBlocks(ctx context.Context, j *job, remote int) *Error {
	req := j.simRequest()
	p, err := s.eng.Pull(ctx, &req, remote)
	s.metrics.transferred(j.rank, p.Blocks)
	switch {
	case err != nil && ctx.Err() != nil:
		return badRequest("request cancelled during the KV transfer: %v", ctx.Err())
	case err != nil:
		return internal("%v", err)
	}
	j.transferred = req.Transferred
	return nil
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
