package bindings

import (
	"fmt"

	"github.com/kvrouter/kvrouter/internal/escape"
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

// Key returns the KV key of (model, session): "<model>.<session>", each
// escaped so that any bytes make a valid key token (escape.BindingKey).
// Letters, digits and '-' stay as they are; every other byte becomes '_'
// and two upper-case hex digits; an empty model is "_" (which no non-empty
// name can produce). Escaping is injective, so distinct (model, session) pairs never
// share a key. Use it to find a binding with `nats kv get kvr-bindings <key>`.
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
	if model, err = escape.BindingKey.Unescape(key[:dot]); err != nil {
		return "", "", fmt.Errorf("bindings: key %q: model: %w", key, err)
	}
	if session, err = escape.BindingKey.Unescape(key[dot+1:]); err != nil {
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
	dst = escape.BindingKey.Append(dst, model)
	dst = append(dst, '.')
	return escape.BindingKey.Append(dst, session)
}
