package kvevents

import (
	"errors"
	"fmt"
	"strings"
)

// DefaultPrefix is the first subject token(s) of every kvrouter subject.
const DefaultPrefix = "kvr"

// DefaultStream is the JetStream stream that stores event batches.
const DefaultStream = "KVR_EVENTS"

// ErrBadSubjectToken reports a string that is not a SubjectToken encoding.
var ErrBadSubjectToken = errors.New("kvevents: bad subject token")

// EventSubject returns the subject a (model, worker) publishes its event
// batches on: <prefix>.events.<model>.<worker>, with model and worker
// escaped by SubjectToken. An empty prefix means DefaultPrefix. The prefix
// is used as given and may itself contain dots ("acme.kvr").
func EventSubject(prefix, model, worker string) string {
	return eventsRoot(prefix) + "." + SubjectToken(model) + "." + SubjectToken(worker)
}

// EventSubjectFilter returns the subject filter that covers every event
// subject under prefix: <prefix>.events.>
func EventSubjectFilter(prefix string) string { return eventsRoot(prefix) + ".>" }

func eventsRoot(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + ".events"
}

// ParseEventSubject splits an event subject under prefix into its unescaped
// model and worker names.
func ParseEventSubject(prefix, subject string) (model, worker string, err error) {
	root := eventsRoot(prefix) + "."
	rest, ok := strings.CutPrefix(subject, root)
	if !ok {
		return "", "", fmt.Errorf("%w: subject %q is not under %q", ErrBadSubjectToken, subject, root)
	}
	mt, wt, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(wt, ".") {
		return "", "", fmt.Errorf("%w: subject %q: want %s<model>.<worker>", ErrBadSubjectToken, subject, root)
	}
	if model, err = UnescapeSubjectToken(mt); err != nil {
		return "", "", err
	}
	if worker, err = UnescapeSubjectToken(wt); err != nil {
		return "", "", err
	}
	return model, worker, nil
}

// SubjectToken escapes any string into one valid NATS subject token, so a
// model name like "meta-llama/Llama-3.1-8B" or a worker id with dots can sit
// in a subject. Printable ASCII except '.', '*', '>' and '%' is kept; every
// other byte (space and other whitespace, control bytes, '.', '*', '>',
// '%', bytes >= 0x7f) becomes "%XX" with two upper-case hex digits. The
// empty string becomes "%" alone, which no non-empty string produces. The
// mapping is one-to-one: UnescapeSubjectToken inverts it and rejects every
// token it would not produce.
func SubjectToken(s string) string {
	if s == "" {
		return "%"
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if !tokenSafe(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if tokenSafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0xf])
	}
	return b.String()
}

const upperHex = "0123456789ABCDEF"

func tokenSafe(c byte) bool {
	return c > ' ' && c < 0x7f && c != '.' && c != '*' && c != '>' && c != '%'
}

// UnescapeSubjectToken inverts SubjectToken. It returns ErrBadSubjectToken
// for a token SubjectToken never produces (a bad or lower-case escape, an
// escape of a byte that needs none, an unsafe raw byte), so that every
// accepted token has exactly one meaning.
func UnescapeSubjectToken(tok string) (string, error) {
	if tok == "%" {
		return "", nil
	}
	if tok == "" {
		return "", fmt.Errorf("%w: empty token", ErrBadSubjectToken)
	}
	if !strings.Contains(tok, "%") {
		for i := 0; i < len(tok); i++ {
			if !tokenSafe(tok[i]) {
				return "", fmt.Errorf("%w: %q has unescaped byte %#x", ErrBadSubjectToken, tok, tok[i])
			}
		}
		return tok, nil
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != '%' {
			if !tokenSafe(c) {
				return "", fmt.Errorf("%w: %q has unescaped byte %#x", ErrBadSubjectToken, tok, c)
			}
			out = append(out, c)
			continue
		}
		if i+2 >= len(tok) {
			return "", fmt.Errorf("%w: %q has a truncated escape at %d", ErrBadSubjectToken, tok, i)
		}
		hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("%w: %q has a bad escape at %d", ErrBadSubjectToken, tok, i)
		}
		v := byte(hi<<4 | lo)
		if tokenSafe(v) {
			return "", fmt.Errorf("%w: %q escapes %q, which needs no escape", ErrBadSubjectToken, tok, v)
		}
		out = append(out, v)
		i += 2
	}
	return string(out), nil
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

// tokenMatches reports whether tok == SubjectToken(s) without allocating.
func tokenMatches(tok string, s string) bool {
	if s == "" {
		return tok == "%"
	}
	j := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if tokenSafe(c) {
			if j >= len(tok) || tok[j] != c {
				return false
			}
			j++
			continue
		}
		if j+3 > len(tok) || tok[j] != '%' || tok[j+1] != upperHex[c>>4] || tok[j+2] != upperHex[c&0xf] {
			return false
		}
		j += 3
	}
	return j == len(tok)
}
