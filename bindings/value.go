package bindings

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// record is the JSON value stored under a binding's key (see
// docs/protocol.md). Everything lives in the value because KV
// entries carry no headers.
type record struct {
	Model   string       `json:"model"`
	Session string       `json:"session"`
	Worker  string       `json:"worker"`
	Rank    *uint32      `json:"rank,omitempty"`
	Mode    session.Mode `json:"mode"`
	Version uint64       `json:"version"`
	Writer  string       `json:"writer"`
	Created time.Time    `json:"created"`
	Renewed time.Time    `json:"renewed"`
	// TTLSeconds is the idle TTL the writer put on this revision; readers
	// use it to expire cached entries whose expiry marker they missed.
	TTLSeconds int64 `json:"ttl_s"`
	// Nonce is unique per write attempt. After a write whose outcome is
	// unknown, the writer reads the key from the stream leader and compares
	// nonces: equal means the write landed.
	Nonce string `json:"nonce"`
}

var (
	errNoWorker  = errors.New("worker is empty")
	errNoSession = errors.New("session is empty")
	errVersion   = errors.New("version is 0")
	errNoNonce   = errors.New("nonce is empty")
	errTTL       = errors.New("ttl_s is negative")
)

func encodeRecord(r *record) ([]byte, error) {
	return json.Marshal(r)
}

// decodeRecord parses and checks a stored value. Unknown fields are ignored
// (a newer writer may add some); missing or invalid required fields are an
// error.
func decodeRecord(data []byte) (record, error) {
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return record{}, err
	}
	switch {
	case r.Worker == "":
		return record{}, errNoWorker
	case r.Session == "":
		return record{}, errNoSession
	case !r.Mode.Valid():
		return record{}, fmt.Errorf("%w: %s", session.ErrUnknownMode, r.Mode)
	case r.Version == 0:
		return record{}, errVersion
	case r.Nonce == "":
		return record{}, errNoNonce
	case r.TTLSeconds < 0:
		return record{}, errTTL
	}
	return r, nil
}

func (r *record) binding(rev uint64) Binding {
	b := Binding{
		Model:    r.Model,
		Session:  r.Session,
		Target:   workerref.Any(r.Worker),
		Mode:     r.Mode,
		Version:  r.Version,
		Writer:   r.Writer,
		Created:  r.Created,
		Renewed:  r.Renewed,
		Revision: rev,
	}
	if r.Rank != nil {
		b.Target = workerref.Of(r.Worker, *r.Rank)
	}
	return b
}

func (r *record) ttl() time.Duration { return time.Duration(r.TTLSeconds) * time.Second }

// recordFor builds the value that binds (model, session) to t.
func recordFor(model, session string, t workerref.Target, mode session.Mode, version uint64, writer string, created, now time.Time, ttl time.Duration, nonce string) record {
	r := record{
		Model: model, Session: session, Worker: t.Worker, Mode: mode, Version: version,
		Writer: writer, Created: created.UTC(), Renewed: now.UTC(),
		TTLSeconds: int64(ttl / time.Second), Nonce: nonce,
	}
	if !t.AnyRank {
		rank := t.Rank
		r.Rank = &rank
	}
	return r
}

// A nonce is <16 hex>-<attempt> (docs/protocol.md): base, the random part
// of one Route call, in exactly 16 lower-case hex digits (leading zeros
// kept, so that every nonce has one form), then the index of the write
// within the call. makeNonce and nonceIndex share appendNoncePrefix, so the
// prefix a write carries and the one it is recognised by cannot differ.
const noncePrefixLen = 16 + 1

func appendNoncePrefix(dst []byte, base uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, digits[base>>uint(shift)&0xf])
	}
	return append(dst, '-')
}

func makeNonce(base uint64, attempt int) string {
	var b [noncePrefixLen + 20]byte
	s := appendNoncePrefix(b[:0], base)
	s = strconv.AppendInt(s, int64(attempt), 10)
	return string(s)
}

// nonceIndex returns the write index of a nonce made by makeNonce(base, i).
func nonceIndex(nonce string, base uint64) (int, bool) {
	var b [noncePrefixLen]byte
	prefix := appendNoncePrefix(b[:0], base)
	if len(nonce) <= len(prefix) || nonce[:len(prefix)] != string(prefix) {
		return 0, false
	}
	i, err := strconv.Atoi(nonce[len(prefix):])
	if err != nil || i < 0 || i >= maxAttemptsLimit {
		return 0, false
	}
	return i, true
}
