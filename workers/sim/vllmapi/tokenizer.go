package vllmapi

import (
	"fmt"
	"strings"
)

// The simulator's tokenizer is byte-level: token id b is the byte b of the
// UTF-8 text, ids 0..255, no special tokens and no BOS. Tokenize(a+b) is
// therefore always Tokenize(a) followed by Tokenize(b), which is what makes
// a conversation's next turn a strict extension of the previous one.
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
func Detokenize(tokens []uint32) (string, error) {
	var b strings.Builder
	b.Grow(len(tokens))
	for i, t := range tokens {
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

// Message is one chat message after its content parts are joined.
type Message struct {
	Role    string
	Content string
}

// The chat template. Each message is
//
//	<|ROLE|>\nCONTENT<|end|>\n
//
// and add_generation_prompt appends "<|assistant|>\n". The assistant's reply
// is generated right after that, so turn N+1 (turn N's messages, the reply
// as an assistant message, a new user message) renders to turn N's prompt,
// the reply, "<|end|>\n" and the new message: a strict extension.
const (
	templateEnd       = "<|end|>\n"
	generationPrompt  = "<|assistant|>\n"
	templateRoleOpen  = "<|"
	templateRoleClose = "|>\n"
)

// RenderChat renders messages with the chat template.
func RenderChat(msgs []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(templateRoleOpen)
		b.WriteString(m.Role)
		b.WriteString(templateRoleClose)
		b.WriteString(m.Content)
		b.WriteString(templateEnd)
	}
	if addGenerationPrompt {
		b.WriteString(generationPrompt)
	}
	return b.String()
}
