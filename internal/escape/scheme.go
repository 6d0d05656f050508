package escape

import (
	"fmt"
	"strings"
)

const upperHex = "0123456789ABCDEF"

// Scheme is one escaping: the bytes of its safe alphabet are kept, every
// other byte becomes the escape byte and two upper-case hex digits, and the
// empty name becomes the escape byte alone, which no non-empty name
// produces. The mapping is one-to-one: Unescape inverts Escape and rejects
// every token Escape would not produce (a lower-case or needless escape, an
// unsafe raw byte), so an accepted token has exactly one meaning. A Scheme is
// read-only once built and safe for concurrent use.
type Scheme struct {
	esc  byte
	safe [256]bool
}

// New returns the scheme that escapes with esc and keeps the bytes for which
// safe reports true. The hex digits must be safe and esc must not be, or
// tokens would leave the alphabet or be ambiguous; New panics then, since
// that is a fault in the scheme's definition, never in any input.
func New(esc byte, safe func(c byte) bool) *Scheme {
	s := &Scheme{esc: esc}
	for c := range 256 {
		s.safe[c] = safe(byte(c))
	}
	if s.safe[esc] {
		panic(fmt.Sprintf("escape: escape byte %q is in the safe alphabet", esc))
	}
	for i := range len(upperHex) {
		if !s.safe[upperHex[i]] {
			panic(fmt.Sprintf("escape: hex digit %q is not in the safe alphabet", upperHex[i]))
		}
	}
	return s
}

// Safe reports whether c is kept as it is.
func (s *Scheme) Safe(c byte) bool { return s.safe[c] }

// Escape returns name as one token. A name that needs no escape is returned
// as it is, without allocating.
func (s *Scheme) Escape(name string) string {
	if name == "" {
		return string(s.esc)
	}
	n := 0
	for i := 0; i < len(name); i++ {
		if !s.safe[name[i]] {
			n++
		}
	}
	if n == 0 {
		return name
	}
	var b strings.Builder
	b.Grow(len(name) + 2*n)
	for i := 0; i < len(name); i++ {
		c := name[i]
		if s.safe[c] {
			b.WriteByte(c)
			continue
		}
		b.WriteByte(s.esc)
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0xf])
	}
	return b.String()
}

// Append appends the token of name to dst, for callers that build a longer
// key in one buffer.
func (s *Scheme) Append(dst []byte, name string) []byte {
	if name == "" {
		return append(dst, s.esc)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if s.safe[c] {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, s.esc, upperHex[c>>4], upperHex[c&0xf])
	}
	return dst
}

// Matches reports whether tok == s.Escape(name), without allocating: the
// check a subscriber makes on every message.
func (s *Scheme) Matches(tok, name string) bool {
	if name == "" {
		return len(tok) == 1 && tok[0] == s.esc
	}
	j := 0
	for i := 0; i < len(name); i++ {
		c := name[i]
		if s.safe[c] {
			if j >= len(tok) || tok[j] != c {
				return false
			}
			j++
			continue
		}
		if j+3 > len(tok) || tok[j] != s.esc || tok[j+1] != upperHex[c>>4] || tok[j+2] != upperHex[c&0xf] {
			return false
		}
		j += 3
	}
	return j == len(tok)
}

// Unescape inverts Escape. A token Escape never produces is an *Error. A
// token without escapes is returned as it is, without allocating.
func (s *Scheme) Unescape(tok string) (string, error) {
	if len(tok) == 1 && tok[0] == s.esc {
		return "", nil
	}
	if tok == "" {
		return "", &Error{Token: tok, Reason: "empty token"}
	}
	if strings.IndexByte(tok, s.esc) < 0 {
		for i := 0; i < len(tok); i++ {
			if !s.safe[tok[i]] {
				return "", &Error{Token: tok, At: i, Reason: fmt.Sprintf("unescaped byte %#x", tok[i])}
			}
		}
		return tok, nil
	}
	var b strings.Builder
	b.Grow(len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != s.esc {
			if !s.safe[c] {
				return "", &Error{Token: tok, At: i, Reason: fmt.Sprintf("unescaped byte %#x", c)}
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(tok) {
			return "", &Error{Token: tok, At: i, Reason: "truncated escape"}
		}
		hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
		if hi < 0 || lo < 0 {
			return "", &Error{Token: tok, At: i, Reason: "bad escape " + tok[i:i+3]}
		}
		v := byte(hi<<4 | lo)
		if s.safe[v] {
			return "", &Error{Token: tok, At: i, Reason: fmt.Sprintf("needless escape of %q", v)}
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), nil
}

// unhex decodes one upper-case hex digit, or returns -1.
func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// Error is a token that no name escapes to.
type Error struct {
	Token  string
	At     int    // byte offset of the fault in Token
	Reason string // what is wrong there
}

func (e *Error) Error() string {
	if e.Token == "" {
		return e.Reason
	}
	return fmt.Sprintf("token %q: %s at byte %d", e.Token, e.Reason, e.At)
}
