package bindings

import (
	"fmt"
)

const (
	// MaxSessionLen is the longest accepted session id, in bytes (as in
	// Dynamo's session affinity).
	MaxSessionLen = 256
	// MaxModelLen is the longest accepted model name, in bytes.
	MaxModelLen = 256
	// maxKeyLen bounds an escaped key: every byte may take three characters,
	// plus the separating dot.
	maxKeyLen = 3*(MaxModelLen+MaxSessionLen) + 1
)

const hexUpper = "0123456789ABCDEF"

// Key returns the KV key of (model, session): "<model>.<session>", each
// escaped so that any bytes make a valid key token. Letters, digits and '-'
// stay as they are; every other byte becomes '_' and two upper-case hex
// digits; an empty model is "_" (which no non-empty name can produce).
// Escaping is injective, so distinct (model, session) pairs never share a
// key. Use it to find a binding with `nats kv get kvr-bindings <key>`.
func Key(model, session string) (string, error) {
	if err := validate(model, session); err != nil {
		return "", err
	}
	var buf [maxKeyLen]byte
	return string(appendKey(buf[:0], model, session)), nil
}

// ParseKey inverts Key.
func ParseKey(key string) (model, session string, err error) {
	dot := -1
	for i := 0; i < len(key); i++ {
		if key[i] == '.' {
			if dot >= 0 {
				return "", "", fmt.Errorf("bindings: key %q has more than two tokens", key)
			}
			dot = i
		}
	}
	if dot < 0 {
		return "", "", fmt.Errorf("bindings: key %q has no model token", key)
	}
	if model, err = unescapeToken(key[:dot]); err != nil {
		return "", "", fmt.Errorf("bindings: key %q: model: %w", key, err)
	}
	if session, err = unescapeToken(key[dot+1:]); err != nil {
		return "", "", fmt.Errorf("bindings: key %q: session: %w", key, err)
	}
	if err := validate(model, session); err != nil {
		return "", "", err
	}
	return model, session, nil
}

func validate(model, session string) error {
	if session == "" {
		return fmt.Errorf("%w: empty", ErrInvalidSession)
	}
	if len(session) > MaxSessionLen {
		return fmt.Errorf("%w: %d bytes (at most %d), starting %q", ErrInvalidSession, len(session), MaxSessionLen, session[:32])
	}
	if len(model) > MaxModelLen {
		return fmt.Errorf("%w: %d bytes (at most %d), starting %q", ErrInvalidModel, len(model), MaxModelLen, model[:32])
	}
	return nil
}

// appendKey appends the escaped key to dst. Inputs must be validated.
func appendKey(dst []byte, model, session string) []byte {
	dst = appendToken(dst, model)
	dst = append(dst, '.')
	return appendToken(dst, session)
}

func appendToken(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, '_')
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keepByte(c) {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '_', hexUpper[c>>4], hexUpper[c&0xF])
	}
	return dst
}

func keepByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

func unescapeToken(tok string) (string, error) {
	if tok == "_" {
		return "", nil
	}
	if tok == "" {
		return "", fmt.Errorf("empty token")
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case keepByte(c):
			out = append(out, c)
		case c == '_' && i+2 < len(tok):
			hi, ok1 := unhex(tok[i+1])
			lo, ok2 := unhex(tok[i+2])
			if !ok1 || !ok2 {
				return "", fmt.Errorf("bad escape %q at %d", tok[i:i+3], i)
			}
			v := hi<<4 | lo
			if keepByte(v) {
				// Not produced by appendToken: reject so escaping stays
				// a bijection.
				return "", fmt.Errorf("needless escape %q at %d", tok[i:i+3], i)
			}
			out = append(out, v)
			i += 2
		default:
			return "", fmt.Errorf("bad byte %q at %d", c, i)
		}
	}
	return string(out), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
