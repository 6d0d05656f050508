// Package gateway is kvrouter's OpenAI-compatible HTTP gateway: an OpenAI
// client pointed at it gets prefix-aware, session-aware routing with
// bookings that balance, and nothing else to do.
//
// For each POST /v1/chat/completions or /v1/completions it reads only what
// routing needs (model, messages or prompt, stream, max_tokens or
// max_completion_tokens, user, the fields that shape the prompt; request.go),
// asks a live engine of the model for the prompt's exact token ids (its
// render endpoint, else /tokenize given every field it has; a request with
// a field /tokenize lacks then routes on load: render.go, tokenize.go) or,
// with Config.Tokenizer approx, cuts the prompt text into pseudo-blocks for
// a replica in approximate mode (approx.go); for a chat with media parts it
// takes the token ids and the items' identifiers and positions from the
// engine's render endpoint, or routes only before the first item
// (media.go). It routes them
// through a Router (route, prefill done, free, cancel; router.go), forwards
// the client's body unchanged to the chosen engine, streams the reply back
// event by event (events already read from the engine go out in one
// write), and books: prefill_done at the first streamed token,
// free exactly once at the end (a whole reply gets free alone), on client
// disconnect or on upstream failure (forward.go). A failure before the first byte is
// retried once on another worker. With Config.PD a request asks for a
// prefill/decode pair and a split one runs as two legs (pd.go, docs/pd.md). GET /v1/models lists the models with
// live workers and the LoRA adapters those serve; every other path is 404
// in OpenAI's error shape (errors.go). An adapter's name is a model: it
// routes as its base model's, among the workers serving it, with lora_name;
// cache_salt routes as cache_salt (adapters.go).
//
// The endpoint picker (package epp) runs the same reading, tokenization,
// routing and booking without the HTTP relay: Prepare, Route, PrefillDone,
// Free and Engines (picker.go, forward.go) are what it calls.
//
// The Router is satisfied by the route API over NATS (ClientRouter, what
// `kvrouter gateway` runs) and by an in-process replica (ReplicaRouter,
// `kvrouter serve --openai-addr`). Telemetry goes through the OpenTelemetry
// API only (telemetry.go: metrics; genai.go: the GenAI conventions' span
// attributes); exporters are set up by the command.
//
// It does not route (router/host does), hold bookings (the replicas do) or
// parse the engine's replies beyond finding SSE event boundaries and the
// first token. docs/gateway.md is the user's documentation.
//
// Where to start reading: Gateway.generate in generate.go, then
// exchange.run in forward.go.
package gateway
