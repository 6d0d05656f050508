package workers

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvrouter/kvrouter/internal/escape"
	"github.com/kvrouter/kvrouter/workerref"
)

// State says whether a registered worker takes new requests.
type State string

const (
	// StateReady: the worker is live and takes new requests.
	StateReady State = "ready"
	// StateDraining: the worker is live (its cache and bindings stay valid)
	// and takes no new sessions and no unbound work, but keeps serving the
	// requests of Hard sessions bound to it, until it deregisters or its
	// Info.DrainDeadline passes (then routers depart it).
	StateDraining State = "draining"
	// StateUnavailable: the worker is live but its engine is not answering
	// (health check failing, or its load reports stale: see workers/bridge).
	// Like draining, routers keep its cache and bindings and do not choose
	// it; unlike draining, it comes back to ready on its own.
	StateUnavailable State = "unavailable"
)

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool { return s == StateReady || s == StateDraining || s == StateUnavailable }

// InfoVersion is the format version written in every registry value ("v").
// Decoders reject any other version rather than guess at its meaning.
const InfoVersion = 1

// Limits on an Info; a value beyond them is rejected as malformed.
const (
	MaxIDLen       = 256
	MaxEndpointLen = 1024
	MaxRanks       = 1024
	MaxLabels      = 64
	MaxLabelLen    = 256
	MaxInfoBytes   = 64 << 10
)

// Info is what a worker publishes about itself in the registry: identity,
// where to send requests, what it can hold, and its incarnation.
//
// ID is the worker's global identity: it is the Worker of every
// workerref.Target the worker owns, and it names the registry key. Epoch
// changes at every start of the worker process; a changed epoch under the
// same ID is a new incarnation whose cache starts empty.
type Info struct {
	ID               string            `json:"id"`
	Model            string            `json:"model"`
	Endpoint         string            `json:"endpoint"`
	Ranks            []uint32          `json:"ranks"`
	BlockSize        int               `json:"block_size"`
	KVBlocks         int               `json:"kv_blocks"`
	MaxBatchedTokens int               `json:"max_batched_tokens"`
	MaxSeqs          int               `json:"max_seqs"`
	Epoch            uint64            `json:"epoch"`
	Labels           map[string]string `json:"labels,omitempty"`
	State            State             `json:"state"`
	// DrainDeadline (state draining only; zero = none) is the absolute
	// time at which routers stop waiting for the drain: every replica
	// confirms the worker's departure then, whether or not its key still
	// exists, and its sessions re-bind. It is absolute so that all replicas
	// agree on it (within their clocks' skew). Set by
	// Registration.SetDrainingUntil and Drain.
	DrainDeadline time.Time `json:"drain_deadline,omitzero"`
	// Adapters (the LoRA adapters the worker serves on top of Model, by
	// the names requests use), LoadedAdapters (those resident on its GPU
	// as last seen, a subset) and MaxLoRAs (how many it holds at once; 0 =
	// unknown): see adapters.go. All omitted when empty, so a worker
	// without adapters writes the same value as before they existed.
	Adapters       []string `json:"adapters,omitempty"`
	LoadedAdapters []string `json:"loaded_adapters,omitempty"`
	MaxLoRAs       int      `json:"max_loras,omitempty"`
	// Role is the worker's part in a prefill/decode-disaggregated fleet
	// (role.go); omitted (both) for a whole engine, so such a worker
	// writes the same value as before roles existed. BootstrapPort is an
	// SGLang prefill server's --disaggregation-bootstrap-port (0 = none).
	Role          Role `json:"role,omitempty"`
	BootstrapPort int  `json:"bootstrap_port,omitempty"`
}

// wireInfo adds the format version to Info on the wire.
type wireInfo struct {
	V int `json:"v"`
	Info
}

// Clone returns a deep copy of i (Ranks, Labels and the adapter lists are
// not shared).
func (i Info) Clone() Info {
	i.Ranks = slices.Clone(i.Ranks)
	i.Labels = maps.Clone(i.Labels)
	i.Adapters, i.LoadedAdapters = slices.Clone(i.Adapters), slices.Clone(i.LoadedAdapters)
	return i
}

// Equal reports whether two infos have the same content.
func (i Info) Equal(o Info) bool {
	return i.ID == o.ID && i.Model == o.Model && i.Endpoint == o.Endpoint &&
		slices.Equal(i.Ranks, o.Ranks) && i.BlockSize == o.BlockSize && i.KVBlocks == o.KVBlocks &&
		i.MaxBatchedTokens == o.MaxBatchedTokens && i.MaxSeqs == o.MaxSeqs && i.Epoch == o.Epoch &&
		maps.Equal(i.Labels, o.Labels) && i.State == o.State && i.DrainDeadline.Equal(o.DrainDeadline) &&
		i.adaptersEqual(o) && i.Role.Or() == o.Role.Or() && i.BootstrapPort == o.BootstrapPort
}

// Available reports whether the worker takes new requests.
func (i Info) Available() bool { return i.State == StateReady }

// Targets returns one workerref.Target per data-parallel rank.
func (i Info) Targets() []workerref.Target {
	out := make([]workerref.Target, len(i.Ranks))
	for n, r := range i.Ranks {
		out[n] = workerref.Target{Worker: i.ID, Rank: r}
	}
	return out
}

// Key returns the registry key of this worker (see KeyFor).
func (i Info) Key() string { return KeyFor(i.ID) }

// KeyFor returns the registry key for a worker id: the id escaped into the
// KV key alphabet by escape.WorkerKey ('=' escapes, [A-Za-z0-9_-] kept). The key is not scoped by model because the id alone is
// the worker's identity (workerref.Target and Live take no model); one
// key per id lets Create's compare-and-set reject a duplicate id even when
// the two processes claim different models.
func KeyFor(id string) string { return escape.WorkerKey.Escape(id) }

// ErrInvalidInfo is wrapped by every validation and decoding error of an
// Info; the concrete error is an *InfoError.
var ErrInvalidInfo = errors.New("workers: invalid worker info")

// InfoError says which field of which worker's Info is wrong.
type InfoError struct {
	ID     string // the worker id as far as it is known
	Field  string // the JSON field name, or "value" for the whole value
	Reason string
	Err    error // the underlying decoding error, if any
}

func (e *InfoError) Error() string {
	msg := fmt.Sprintf("workers: invalid worker info %q: %s: %s", e.ID, e.Field, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap lets errors.Is match ErrInvalidInfo and the underlying error.
func (e *InfoError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalidInfo, e.Err}
	}
	return []error{ErrInvalidInfo}
}

// Validate checks i and returns an *InfoError naming the first bad field.
func (i Info) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &InfoError{ID: i.ID, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if err := checkName(i.ID, MaxIDLen); err != "" {
		return bad("id", "%s", err)
	}
	if err := checkName(i.Model, MaxIDLen); err != "" {
		return bad("model", "%s (model %q)", err, i.Model)
	}
	if err := checkName(i.Endpoint, MaxEndpointLen); err != "" {
		return bad("endpoint", "%s (endpoint %q)", err, i.Endpoint)
	}
	if len(i.Ranks) == 0 {
		return bad("ranks", "no data-parallel rank (use [0] without data parallelism)")
	}
	if len(i.Ranks) > MaxRanks {
		return bad("ranks", "%d ranks, more than %d", len(i.Ranks), MaxRanks)
	}
	seen := make(map[uint32]struct{}, len(i.Ranks))
	for _, r := range i.Ranks {
		if _, dup := seen[r]; dup {
			return bad("ranks", "rank %d listed twice", r)
		}
		seen[r] = struct{}{}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"block_size", i.BlockSize}, {"kv_blocks", i.KVBlocks}, {"max_batched_tokens", i.MaxBatchedTokens}, {"max_seqs", i.MaxSeqs}} {
		if f.v <= 0 {
			return bad(f.name, "%d, must be positive", f.v)
		}
	}
	if i.Epoch == 0 {
		return bad("epoch", "0 (every start needs a new non-zero epoch)")
	}
	if len(i.Labels) > MaxLabels {
		return bad("labels", "%d labels, more than %d", len(i.Labels), MaxLabels)
	}
	for k, v := range i.Labels {
		if err := checkName(k, MaxLabelLen); err != "" {
			return bad("labels", "label name %q: %s", k, err)
		}
		if len(v) > MaxLabelLen || !utf8.ValidString(v) {
			return bad("labels", "label %q: value longer than %d bytes or not UTF-8", k, MaxLabelLen)
		}
	}
	if err := i.validateAdapters(); err != nil {
		return err
	}
	if !i.Role.Valid() {
		return bad("role", "%q, want %q, %q or %q", i.Role, RolePrefill, RoleDecode, RoleBoth)
	}
	if i.BootstrapPort < 0 || i.BootstrapPort > 65535 {
		return bad("bootstrap_port", "%d, not a port", i.BootstrapPort)
	}
	if !i.State.Valid() {
		return bad("state", "%q, want %q, %q or %q", i.State, StateReady, StateDraining, StateUnavailable)
	}
	if !i.DrainDeadline.IsZero() && i.State != StateDraining {
		return bad("drain_deadline", "%s set in state %q (only a draining worker has one)",
			i.DrainDeadline.Format(time.RFC3339Nano), i.State)
	}
	return nil
}

// checkName returns "" for a non-empty printable UTF-8 string of at most
// max bytes, else why not.
func checkName(s string, max int) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > max:
		return fmt.Sprintf("%d bytes, more than %d", len(s), max)
	case !utf8.ValidString(s):
		return "not UTF-8"
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "contains a control character"
	}
	return ""
}

// EncodeInfo validates i and returns its registry value (JSON with "v").
func EncodeInfo(i Info) ([]byte, error) {
	if err := i.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(wireInfo{V: InfoVersion, Info: i})
	if err != nil {
		return nil, &InfoError{ID: i.ID, Field: "value", Reason: "cannot encode", Err: err}
	}
	return b, nil
}

// DecodeInfo parses and validates a registry value. Unknown fields are
// ignored (a newer worker may add some); a missing or different "v" is
// rejected. Every error wraps ErrInvalidInfo.
func DecodeInfo(data []byte) (Info, error) {
	if len(data) > MaxInfoBytes {
		return Info{}, &InfoError{Field: "value", Reason: fmt.Sprintf("%d bytes, more than %d", len(data), MaxInfoBytes)}
	}
	var w wireInfo
	if err := json.Unmarshal(data, &w); err != nil {
		return Info{}, &InfoError{Field: "value", Reason: "not a JSON worker info", Err: err}
	}
	if w.V != InfoVersion {
		return Info{}, &InfoError{ID: w.ID, Field: "v", Reason: fmt.Sprintf("format version %d, want %d", w.V, InfoVersion)}
	}
	if err := w.Info.Validate(); err != nil {
		return Info{}, err
	}
	return w.Info, nil
}

// NewEpoch returns a random non-zero epoch for a new incarnation. It stays
// below 2^53 so that JSON readers that parse numbers as float64 (JavaScript,
// jq) keep it exact.
func NewEpoch() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24)
		if e := binary.LittleEndian.Uint64(b[:]) & (1<<53 - 1); e != 0 {
			return e
		}
	}
}
