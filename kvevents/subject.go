package kvevents

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvrouter/kvrouter/internal/escape"
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
// token it would not produce. It is internal/escape's scheme with '%' and
// this alphabet.
func SubjectToken(s string) string { return subjectTokens.Escape(s) }

// subjectTokens is the subject-token scheme; read-only after package init.
var subjectTokens = escape.New('%', tokenSafe)

func tokenSafe(c byte) bool {
	return c > ' ' && c < 0x7f && c != '.' && c != '*' && c != '>' && c != '%'
}

// UnescapeSubjectToken inverts SubjectToken. It returns an error wrapping
// ErrBadSubjectToken (and an *escape.Error naming the fault) for a token
// SubjectToken never produces (a bad or lower-case escape, an escape of a
// byte that needs none, an unsafe raw byte), so that every accepted token
// has exactly one meaning.
func UnescapeSubjectToken(tok string) (string, error) {
	s, err := subjectTokens.Unescape(tok)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadSubjectToken, err)
	}
	return s, nil
}

// tokenMatches reports whether tok == SubjectToken(s) without allocating.
func tokenMatches(tok string, s string) bool { return subjectTokens.Matches(tok, s) }
