// Package vllmapi is the vLLM-compatible HTTP face of a simulated engine
// (workers/sim): the OpenAI API as vLLM serves it, so that OpenAI clients,
// gateways and metric scrapers can talk to the simulator as to `vllm serve`.
//
// It owns:
//
//   - the endpoints (server.go, generate.go): POST /v1/completions and
//     /v1/chat/completions, whole or streamed as Server-Sent Events with
//     vLLM's chunk shapes and usage (prompt_tokens_details.cached_tokens is
//     the prefix the simulated cache held); the render endpoints
//     (render.go: the exact token ids of a generate request, in vLLM's
//     GenerateRequest shape; left out with Config.DisableRender); POST
//     /tokenize and /detokenize;
//     GET /v1/models, /health and /metrics;
//   - the request and reply shapes (api.go), with the simulator's one
//     extension, sim_output_tokens (the reply's length below max_tokens),
//     and vLLM's error replies (errors.go);
//   - the tokenizer and chat template (tokenizer.go): byte-level, no
//     special tokens but an optional BOS (Config.BOS), so that a
//     conversation's next turn tokenizes to a strict extension of the
//     previous prompt and reply; the template renders every field vLLM's
//     chat rendering reads (ChatOptions; api.go merges the request's fields
//     as vLLM does), so that a test can tell a dropped field from a kept
//     one;
//   - /metrics (metrics.go): vLLM's Prometheus names, gauges read from the
//     engine at scrape time, counters and histograms in model time;
//   - traces (trace.go): with Config.TracerProvider, one llm_request span
//     per generate request continuing the caller's traceparent, as vLLM
//     with --otlp-traces-endpoint;
//   - LoRA adapters and cache salts (lora.go): adapters served under their
//     names (GET /v1/models with parent and root), loaded and unloaded at
//     run time, vllm:lora_requests_info; a request's adapter and
//     cache_salt handed to the engine, which hashes them;
//   - prefill/decode disaggregation: vLLM's NixlConnector protocol
//     (pd.go: kv_transfer_params out of a prefill leg, into a decode leg,
//     whose transfer the engine times: sim.Engine.Pull) and SGLang's bootstrap rooms
//     (bootstrap.go); docs/pd.md.
//   - images (media.go): image_url content parts expand into
//     Config.ImageTokens placeholders, identified by their uuid or a content
//     hash as vLLM identifies them, handed to the engine as sim.Request.Media;
//     RenderChat gives a chat's token ids and features (mm_hashes,
//     mm_placeholders) for vLLM's render endpoints.
//
// A client that disconnects cancels its request: the request context is the
// engine's submit context, so the engine drops it and frees its blocks.
//
// It does not own the engine (sim.Engine), KV events (sim.NewVLLMEvents and
// kvevents/vllmzmq) or the command (cmd/kvrouter sim serve). Where it
// differs from vLLM is listed in docs/simulator.md.
//
// Start reading at Server.run in generate.go.
package vllmapi
