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

// ErrBadSubjectToken reports a subject token that escape.SubjectToken does
// not produce.
var ErrBadSubjectToken = errors.New("kvevents: bad subject token")

// EventSubject returns the subject a (model, worker) publishes its event
// batches on: <prefix>.events.<model>.<worker>, with model and worker
// escaped by escape.SubjectToken. An empty prefix means DefaultPrefix. The
// prefix is used as given and may itself contain dots ("acme.kvr").
func EventSubject(prefix, model, worker string) string {
	return eventsRoot(prefix) + "." + escape.SubjectToken.Escape(model) + "." + escape.SubjectToken.Escape(worker)
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
	if model, err = subjectName(mt); err != nil {
		return "", "", err
	}
	if worker, err = subjectName(wt); err != nil {
		return "", "", err
	}
	return model, worker, nil
}

// subjectName inverts escape.SubjectToken for one token of a subject. A
// token the scheme never produces (a bad or lower-case escape, an escape of
// a byte that needs none, an unsafe raw byte) is an error wrapping
// ErrBadSubjectToken and the *escape.Error naming the fault, so that every
// accepted token has exactly one meaning.
func subjectName(tok string) (string, error) {
	s, err := escape.SubjectToken.Unescape(tok)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadSubjectToken, err)
	}
	return s, nil
}
