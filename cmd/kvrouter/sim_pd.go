package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"github.com/kvrouter/kvrouter/workers/sim"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// simPDFlags are sim serve's prefill/decode disaggregation flags: vLLM's
// --kv-transfer-config, SGLang's --disaggregation-mode, and the transfer
// model (docs/pd.md).
type simPDFlags struct {
	kvTransfer, disagg *string
	gbps               *float64
	blockBytes         *int
}

func addSimPDFlags(c *cmdFlags) *simPDFlags {
	return &simPDFlags{
		kvTransfer: c.str("kv-transfer-config", "", "vLLM's KV connector config, JSON: {\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}; the engine then answers a prefill leg (kv_transfer_params do_remote_decode) with the blocks it holds and pulls them on a decode leg (do_remote_prefill); side channel from VLLM_NIXL_SIDE_CHANNEL_HOST/_PORT (\"\" = no connector)"),
		disagg:     c.str("disaggregation-mode", "", "SGLang's disaggregation mode: prefill (serves GET /kvr/bootstrap/{room} on its HTTP port) or decode (\"\" = off)"),
		gbps:       c.float("kv-transfer-gbps", sim.DefaultTransferGBps, "simulated KV transfer bandwidth in GB/s of model time (not a vLLM flag)"),
		blockBytes: c.integer("kv-block-bytes", sim.DefaultTransferBlockBytes, "bytes of one KV block, for the transfer time (not a vLLM flag)"),
	}
}

// apply validates the flags into cfg.
func (f *simPDFlags) apply(cfg *simServeConfig) error {
	if !(*f.gbps > 0) || *f.blockBytes < 1 {
		return fmt.Errorf("--kv-transfer-gbps %g and --kv-block-bytes %d: want both positive", *f.gbps, *f.blockBytes)
	}
	if *f.kvTransfer != "" && *f.disagg != "" {
		return fmt.Errorf("--kv-transfer-config (vLLM) and --disaggregation-mode (SGLang) are exclusive")
	}
	cfg.disagg = *f.disagg
	cfg.engine.Transfer = sim.TransferModel{BandwidthGBps: *f.gbps, BlockBytes: int64(*f.blockBytes)}
	if *f.kvTransfer == "" {
		if cfg.disagg != "" {
			cfg.kvTransfer = &vllmapi.KVTransferConfig{Connector: "NixlConnector"}
		}
		return nil
	}
	var kc vllmapi.KVTransferConfig
	if err := json.Unmarshal([]byte(*f.kvTransfer), &kc); err != nil {
		return fmt.Errorf("--kv-transfer-config: %w", err)
	}
	if kc.Connector != "NixlConnector" {
		return fmt.Errorf("--kv-transfer-config: kv_connector %q: the simulator speaks NixlConnector only", kc.Connector)
	}
	kc.Host = os.Getenv("VLLM_NIXL_SIDE_CHANNEL_HOST")
	if p := os.Getenv("VLLM_NIXL_SIDE_CHANNEL_PORT"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("VLLM_NIXL_SIDE_CHANNEL_PORT %q: %w", p, err)
		}
		kc.Port = n
	}
	cfg.kvTransfer = &kc
	return nil
}

// transferFor is engine i's transfer config: its own engine id and side
// channel port (base + i, as vLLM's base + DP index), nil without one.
func (cfg simServeConfig) transferFor(i int, worker string) *vllmapi.KVTransferConfig {
	if cfg.kvTransfer == nil {
		return nil
	}
	kc := *cfg.kvTransfer
	kc.EngineID = worker
	if kc.Port == 0 {
		kc.Port = vllmapi.DefaultSideChannelPort
	}
	kc.Port += i * cfg.dp
	return &kc
}
