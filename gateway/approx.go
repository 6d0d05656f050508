package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
	"github.com/zeebo/xxh3"
)

// Tokenizer choices of Config.Tokenizer.
const (
	// TokenizerEngine asks a live engine of the model for the prompt's
	// exact token ids (its render endpoint, else /tokenize; render.go):
	// router hashes equal the engine's blocks.
	TokenizerEngine = "engine"
	// TokenizerApprox makes no /tokenize call: the prompt text is cut into
	// pseudo-blocks (approxBlocks) for a replica in approximate mode, whose
	// index is fed by routing decisions.
	TokenizerApprox = "approx"
)

// ApproxBytesPerToken is the approx tokenizer's estimate of UTF-8 bytes per
// token: a pseudo-block is blockSize × ApproxBytesPerToken bytes of text.
const ApproxBytesPerToken = 4

// The approx scheme (docs/gateway.md, "--tokenizer approx"):
//
//  1. The prompt text: a completion's prompt string as is; a chat's
//     messages rendered canonically, in order, each as its role, "\n", its
//     content, "\n" (content given as a list of parts contributes the text
//     of its text parts, concatenated). The chat template is the engine's
//     business; this rendering only has to be stable, and it is: a
//     conversation's next turn extends the previous turn's text.
//  2. The text's bytes are cut into chunks of C = blockSize ×
//     ApproxBytesPerToken bytes; a trailing partial chunk is left out, as a
//     partial KV block is.
//  3. Chunk i's local hash is XXH3-64 of its bytes with seed
//     kvevents.HashSeed, and the hashes are chained as kvevents chains
//     block hashes: h[0] = local[0], h[i] = kvevents.NextSeqHash(h[i-1],
//     local[i]). Equal text prefixes give equal leading hashes.
//  4. The route request carries them as block_hashes with block_size and
//     input_tokens = ceil(bytes / ApproxBytesPerToken) (at least 1). At most
//     api.MaxBlockHashes leading pseudo-blocks are sent.

// approxText returns the prompt text of a request as the approx scheme
// reads it. ok is false for a prompt that has no single text (a batch, or
// token ids).
func approxText(dst []byte, kind string, cr *clientRequest) ([]byte, bool) {
	if kind == kindCompletion {
		text, ok := promptText(cr.Prompt)
		return append(dst, text...), ok
	}
	var msgs []approxMessage
	if err := json.Unmarshal(cr.Messages, &msgs); err != nil {
		return dst, false
	}
	for _, m := range msgs {
		dst = append(append(dst, m.Role...), '\n')
		dst = append(dst, m.Content...)
		dst = append(dst, '\n')
	}
	return dst, true
}

// approxMessage is one chat message as the canonical rendering reads it.
type approxMessage struct {
	Role    string        `json:"role"`
	Content approxContent `json:"content"`
}

// approxContent is a message's text: a string content, or the text of the
// text parts of a list of parts. Anything else (null, images only)
// contributes nothing. It decodes in the messages' one pass.
type approxContent string

func (c *approxContent) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		return json.Unmarshal(data, (*string)(c))
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(data, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		*c = approxContent(b.String())
	}
	return nil
}

// approxBlocks appends to dst the chained pseudo-block hashes of text at
// blockSize tokens per block (steps 2 and 3 of the scheme), at most
// api.MaxBlockHashes of them. It does not allocate when dst has room.
func approxBlocks(dst []uint64, text []byte, blockSize int) []uint64 {
	if blockSize < 1 {
		return dst
	}
	c := blockSize * ApproxBytesPerToken
	var prev kvevents.SeqHash
	for i := 0; i+c <= len(text) && i/c < api.MaxBlockHashes; i += c {
		local := xxh3.HashSeed(text[i:i+c], kvevents.HashSeed)
		if i == 0 {
			prev = kvevents.SeqHash(local)
		} else {
			prev = kvevents.NextSeqHash(prev, local)
		}
		dst = append(dst, uint64(prev))
	}
	return dst
}

// approxPrompt fills rq's prompt with the approx scheme at the model's
// block size. A prompt given as token ids routes on them (they need no
// tokenizer); one with no single text, or a model whose block size is not
// known yet (no live worker), routes on load alone.
func (g *Gateway) approxPrompt(ctx context.Context, kind string, cr *clientRequest, body []byte, rq *api.RouteRequest) *RequestError {
	if kind == kindCompletion {
		if ids, ok := promptIDs(cr.Prompt); ok {
			if len(ids) > api.MaxTokens {
				return badRequest("prompt", "the prompt has %d tokens, the limit is %d", len(ids), api.MaxTokens)
			}
			rq.TokenIDs = ids
			return nil
		}
	}
	bs := g.blockSize(ctx, cr.Model)
	hashes, inputTokens, ok := approxHashes(kind, cr, bs)
	if !ok {
		rq.InputTokens = max(1, len(body)/ApproxBytesPerToken)
		return nil
	}
	rq.InputTokens = inputTokens
	if len(hashes) > 0 {
		rq.BlockHashes, rq.BlockSize = hashes, bs
	}
	return nil
}

// approxHashes is the approx scheme of a request at block size bs: its
// pseudo-blocks and input_tokens. ok is false without a single text or a
// block size.
func approxHashes(kind string, cr *clientRequest, bs int) ([]uint64, int, bool) {
	if bs < 1 {
		return nil, 0, false
	}
	// The text is at most as long as the JSON it comes from.
	text, ok := approxText(make([]byte, 0, len(cr.Messages)+len(cr.Prompt)), kind, cr)
	if !ok {
		return nil, 0, false
	}
	hashes := approxBlocks(make([]uint64, 0, min(len(text)/(bs*ApproxBytesPerToken), api.MaxBlockHashes)), text, bs)
	return hashes, max(1, (len(text)+ApproxBytesPerToken-1)/ApproxBytesPerToken), true
}

// CheckTokenizer validates a Config.Tokenizer value (the commands check
// their flag with it before starting anything).
func CheckTokenizer(t string) error {
	if t != TokenizerEngine && t != TokenizerApprox {
		return fmt.Errorf("%w: tokenizer %q (want %q or %q)", ErrConfig, t, TokenizerEngine, TokenizerApprox)
	}
	return nil
}
