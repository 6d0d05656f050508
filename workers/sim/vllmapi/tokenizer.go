package vllmapi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// The simulator's tokenizer is byte-level: token id b is the byte b of the
// UTF-8 text, ids 0..255, and no special tokens but an optional BOS
// (BOSToken, Config.BOS). Tokenize(a+b) is therefore always Tokenize(a)
// followed by Tokenize(b), which is what makes a conversation's next turn a
// strict extension of the previous one.
//
// Prompts given as token ids may use any id below 2^31 (for example the
// opaque ids of sim.ExpandBlockIDs); only /detokenize needs ids of the byte
// vocabulary.

// VocabSize is the number of token ids that have a text form.
const VocabSize = 256

// maxTokenID is the largest token id accepted in a prompt (an int32 token id
// everywhere).
const maxTokenID = 1<<31 - 1

// fillerVocab is the vocabulary of generated tokens (sim.Request.Vocab):
// lower-case letters and space, so generated text is printable ASCII that
// tokenizes back to exactly the tokens the engine generated and cached.
var fillerVocab = func() []uint32 {
	v := make([]uint32, 0, 27)
	for b := 'a'; b <= 'z'; b++ {
		v = append(v, uint32(b))
	}
	return append(v, ' ')
}()

// Tokenize returns the tokens of text: its bytes.
func Tokenize(text string) []uint32 {
	out := make([]uint32, len(text))
	for i := 0; i < len(text); i++ {
		out[i] = uint32(text[i])
	}
	return out
}

// Detokenize returns the text of tokens. An id outside the byte vocabulary
// is an error naming it.
func Detokenize(tokens []uint32) (string, error) { return detokenize(tokens, false) }

// detokenize is Detokenize, with BOSToken written as <s> when bos is set.
func detokenize(tokens []uint32, bos bool) (string, error) {
	var b strings.Builder
	b.Grow(len(tokens))
	for i, t := range tokens {
		if bos && t == BOSToken {
			b.WriteString(bosText)
			continue
		}
		if t >= VocabSize {
			return "", fmt.Errorf("token %d at position %d is outside the simulator's byte vocabulary (0..%d)", t, i, VocabSize-1)
		}
		b.WriteByte(byte(t))
	}
	return b.String(), nil
}

// appendText appends the text of generated tokens (always in fillerVocab)
// to dst.
func appendText(dst []byte, tokens []uint32) []byte {
	for _, t := range tokens {
		dst = append(dst, byte(t))
	}
	return dst
}

// BOSToken is the beginning-of-sequence special token of a server with
// Config.BOS: the first id past the byte vocabulary, so no text tokenizes
// to it. It is added in front of a prompt whose request has
// add_special_tokens true (the default of completions and of /tokenize's
// prompt form, not of chat, whose template would carry it), as Llama's
// tokenizer adds <s>. Without Config.BOS the tokenizer has no special
// tokens and add_special_tokens changes nothing (as Qwen's).
const BOSToken = VocabSize

// bosText is BOSToken's text in /detokenize's reply.
const bosText = "<s>"

// Message is one chat message after its content parts are joined.
// ToolCalls is the compact JSON of an assistant message's tool_calls (""
// when it has none).
type Message struct {
	Role      string
	Content   string
	ToolCalls string
}

// The chat template. Each message is
//
//	<|ROLE|>\nCONTENT<|end|>\n
//
// and add_generation_prompt appends "<|assistant|>\n". The assistant's reply
// is generated right after that, so turn N+1 (turn N's messages, the reply
// as an assistant message, a new user message) renders to turn N's prompt,
// the reply, "<|end|>\n" and the new message: a strict extension.
//
// ChatOptions adds what vLLM's chat rendering reads besides the messages
// (docs/simulator.md, "Tokenizer and chat template", has the whole layout).
const (
	templateEnd       = "<|end|>\n"
	generationPrompt  = "<|assistant|>\n"
	templateRoleOpen  = "<|"
	templateRoleClose = "|>\n"
	toolCallsOpen     = "<|tool_calls|>\n"
	// thinkingOff follows the generation prompt when the template
	// variable enable_thinking is false, as Qwen3's template writes an
	// empty thought.
	thinkingOff = "<think>\n\n</think>\n\n"
)

// RenderChat renders messages with the chat template and no other option.
func RenderChat(msgs []Message, addGenerationPrompt bool) string {
	return ChatOptions{AddGenerationPrompt: addGenerationPrompt}.Render(msgs)
}

// ChatOptions are the fields of a chat request that change its rendered
// prompt, after vLLM's merge of the request's fields into the template's
// variables (ChatCompletionRequest.build_chat_params): JSON values are
// compact, as the template's tojson writes them.
type ChatOptions struct {
	AddGenerationPrompt  bool
	ContinueFinalMessage bool // the last message stays open: no <|end|>, no generation prompt
	// ChatTemplate is a client's own template. The simulator runs no
	// Jinja: it renders its template as always, headed by the custom
	// template's identity (templateHeader), so that a prompt rendered
	// without the client's template never matches one rendered with it.
	ChatTemplate string
	Tools        []string // one compact JSON object per tool definition
	ToolChoice   string   // compact JSON; rendered only with Tools, as vLLM passes it
	Documents    []string // the template variable documents, one compact JSON value each
	// ResponseFormat is compact JSON ("" = none): vLLM hands it to the
	// renderer, which may write it into the prompt.
	ResponseFormat  string
	ReasoningEffort string // the template variable reasoning_effort ("" = unset)
	// ThinkingOff is the template variable enable_thinking given as false
	// (Qwen3's test: "enable_thinking is false").
	ThinkingOff bool
}

// Render returns the prompt text of msgs: the header lines of the options
// that are set, in a fixed order, then the messages, then the generation
// prompt. Every header line sits before the first message, as tool
// definitions and system-level options do in real templates.
func (o ChatOptions) Render(msgs []Message) string {
	var b strings.Builder
	o.writeHeader(&b)
	for i, m := range msgs {
		b.WriteString(templateRoleOpen)
		b.WriteString(m.Role)
		b.WriteString(templateRoleClose)
		b.WriteString(m.Content)
		if m.ToolCalls != "" {
			b.WriteString(toolCallsOpen)
			b.WriteString(m.ToolCalls)
		}
		if o.ContinueFinalMessage && i == len(msgs)-1 {
			return b.String() // open-ended: the model continues this message
		}
		b.WriteString(templateEnd)
	}
	if o.AddGenerationPrompt {
		b.WriteString(generationPrompt)
		if o.ThinkingOff {
			b.WriteString(thinkingOff)
		}
	}
	return b.String()
}

// writeHeader writes the option lines: <|template:ID|>, <|tools|>,
// <|tool_choice|>, <|documents|>, <|response_format|>, <|reasoning_effort|>,
// each a section ended by <|end|>.
func (o ChatOptions) writeHeader(b *strings.Builder) {
	section := func(name string, values ...string) {
		b.WriteString(templateRoleOpen + name + templateRoleClose)
		for i, v := range values {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(v)
		}
		b.WriteString(templateEnd)
	}
	if o.ChatTemplate != "" {
		b.WriteString(templateHeader(o.ChatTemplate))
	}
	if len(o.Tools) > 0 {
		section("tools", o.Tools...)
		if o.ToolChoice != "" {
			section("tool_choice", o.ToolChoice)
		}
	}
	if len(o.Documents) > 0 {
		section("documents", o.Documents...)
	}
	if o.ResponseFormat != "" {
		section("response_format", o.ResponseFormat)
	}
	if o.ReasoningEffort != "" {
		section("reasoning_effort", o.ReasoningEffort)
	}
}

// templateHeader is the line that stands for a client's chat template: the
// first 8 bytes of its SHA-256 in hex, "<|template:0123456789abcdef|>\n".
func templateHeader(tmpl string) string {
	sum := sha256.Sum256([]byte(tmpl))
	return "<|template:" + hex.EncodeToString(sum[:8]) + "|>\n"
}

// promptIDs tokenizes a rendered prompt, with BOSToken in front when the
// server has one and the request adds special tokens.
func promptIDs(text string, bos, addSpecial bool) []uint32 {
	if !bos || !addSpecial {
		return Tokenize(text)
	}
	out := make([]uint32, 1, len(text)+1)
	out[0] = BOSToken
	for i := 0; i < len(text); i++ {
		out = append(out, uint32(text[i]))
	}
	return out
}
