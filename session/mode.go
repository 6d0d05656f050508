package session

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrUnknownMode reports a mode other than hard or soft: a string ParseMode
// refuses, or a Mode value outside Hard and Soft where one is required.
var ErrUnknownMode = errors.New("session: unknown mode")

// Mode is how strongly a session is bound to its worker. It is stored in a
// binding's value and becomes the strength of the affinity requirement the
// scheduler sees: Hard confines selection to the bound worker while it is
// eligible, Soft is only a preference.
//
// The numbers are this process's only (the stored and wire forms are the
// strings of String), so their order carries no meaning beyond Unset being
// the zero value.
type Mode uint8

const (
	// Unset is the zero Mode: "use the default" in configuration and in a
	// request that names no mode (the bindings table's default is Hard).
	// It is never stored, and a scheduler requirement that carries it is
	// invalid, so a host that forgets to map a binding's mode is told so.
	Unset Mode = iota
	// Hard: a request of the session must go to the bound worker while that
	// worker is live; a selection elsewhere is rejected, unless the bound
	// worker departed, in which case the session is re-bound.
	Hard
	// Soft: the bound worker is preferred; a selection elsewhere re-binds.
	Soft
)

// ParseMode parses "hard" or "soft", the spelling of the stored value, the
// route API's session_mode, the gateway's mode header and configuration.
// Anything else, "" included, is an error wrapping ErrUnknownMode; callers
// for which an absent mode means the default check for "" first.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "hard":
		return Hard, nil
	case "soft":
		return Soft, nil
	}
	return Unset, fmt.Errorf("%w: %q (want \"hard\" or \"soft\")", ErrUnknownMode, s)
}

// String returns "hard", "soft", "unset" or "mode(N)".
func (m Mode) String() string {
	switch m {
	case Hard:
		return "hard"
	case Soft:
		return "soft"
	case Unset:
		return "unset"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// Valid reports whether m is Hard or Soft.
func (m Mode) Valid() bool { return m == Hard || m == Soft }

// MarshalText encodes a valid mode as "hard" or "soft"; any other value is
// an error wrapping ErrUnknownMode.
func (m Mode) MarshalText() ([]byte, error) {
	if !m.Valid() {
		return nil, fmt.Errorf("%w: %s", ErrUnknownMode, m)
	}
	return []byte(m.String()), nil
}

// UnmarshalText accepts what ParseMode accepts.
func (m *Mode) UnmarshalText(b []byte) error {
	v, err := ParseMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}
