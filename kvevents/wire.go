package kvevents

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvrouter/kvrouter/internal/msgpack"
)

// WireVersion is the version field an engine-keyed Batch starts with, and
// WireVersionSeqKeyed a Batch.SeqKeyed one's. A decoder rejects other
// versions with ErrUnsupportedVersion, so a router built before version 2
// refuses a sequence-keyed batch rather than keep blocks whose removals it
// could not read. Fields added later inside a version are appended at the
// end of an array and skipped by older decoders; only an incompatible
// change bumps the version.
const (
	WireVersion         = 1
	WireVersionSeqKeyed = 2
)

// Limits that bound what one encoded batch may carry. The decoder enforces
// them before allocating, so a hostile message cannot make it allocate more
// than a small multiple of its own size.
const (
	MaxBatchBytes     = 8 << 20 // encoded size
	MaxBatchEvents    = 1 << 16 // events in one batch
	MaxEventBlocks    = 1 << 20 // blocks (or removed hashes) in one event
	MaxNameBytes      = 1024    // model and worker names
	minBatchArrayLen  = 7       // [version, model, worker, rank, epoch, first id, events]
	minStoredArrayLen = 4       // [kind, tier, parent, blocks]
	minRemovedArrayLn = 3       // [kind, tier, hashes]
	// a sequence-keyed stored or removed event: [kind, tier, seqs]
	minSeqEventArrayLen = 3
)

// Decoding errors. Every decoder error, ours and kvevents/vllm's, wraps
// exactly one of these (or ErrUnsupportedVersion), so callers can count bad
// input by cause with errors.Is. They are internal/msgpack's own values,
// named here for code outside internal/.
var (
	// ErrTruncated: the input ends inside a value.
	ErrTruncated = msgpack.ErrTruncated
	// ErrMalformed: the bytes are not the expected msgpack shape or a value
	// is out of range.
	ErrMalformed = msgpack.ErrMalformed
	// ErrOversized: the input, or a count or string inside it, exceeds a
	// decoder limit.
	ErrOversized = msgpack.ErrOversized
)

var (
	// ErrUnsupportedVersion: the batch's version field is neither WireVersion
	// nor WireVersionSeqKeyed.
	ErrUnsupportedVersion = errors.New("kvevents: unsupported wire version")
	// ErrInvalidBatch: a Batch or Event that cannot be encoded as given.
	ErrInvalidBatch = errors.New("kvevents: invalid batch")
)

// AppendBatch appends the msgpack encoding of b to dst (layout in
// docs/protocol.md):
//
//	batch   = [1, model, worker, rank, epoch, first_event_id, [event...]]
//	stored  = [1, tier, parent|nil, [engine0, seq0, engine1, seq1, ...]]
//	removed = [2, tier, [engine...]]
//	cleared = [3]
//
// and for a SeqKeyed batch
//
//	batch   = [2, model, worker, rank, epoch, first_event_id, [event...]]
//	stored  = [1, tier, [seq...]]
//	removed = [2, tier, [seq...]]
//	cleared = [3]
//
// Integers use msgpack's smallest form. It fails with ErrInvalidBatch for an
// unknown event kind, a zero FirstEventID, no events, a count or name over
// the limits above, or an event of the other keying (engine hashes in a
// SeqKeyed batch, RemovedSeqs in an engine-keyed one).
func AppendBatch(dst []byte, b *Batch) ([]byte, error) {
	if err := validateBatch(b); err != nil {
		return dst, err
	}
	dst = msgpack.AppendArrayHeader(dst, minBatchArrayLen)
	dst = msgpack.AppendUint(dst, wireVersion(b.SeqKeyed))
	dst = msgpack.AppendStr(dst, b.Model)
	dst = msgpack.AppendStr(dst, b.Worker)
	dst = msgpack.AppendUint(dst, uint64(b.Rank))
	dst = msgpack.AppendUint(dst, b.Epoch)
	dst = msgpack.AppendUint(dst, b.FirstEventID)
	dst = msgpack.AppendArrayHeader(dst, len(b.Events))
	for i := range b.Events {
		dst = appendKeyed(dst, &b.Events[i], b.SeqKeyed)
	}
	return dst, nil
}

func validateBatch(b *Batch) error {
	switch {
	case len(b.Events) == 0:
		return fmt.Errorf("%w: worker %q: no events", ErrInvalidBatch, b.Worker)
	case len(b.Events) > MaxBatchEvents:
		return fmt.Errorf("%w: worker %q: %d events, limit %d", ErrInvalidBatch, b.Worker, len(b.Events), MaxBatchEvents)
	case b.FirstEventID == 0:
		return fmt.Errorf("%w: worker %q: first event id 0 (ids start at 1)", ErrInvalidBatch, b.Worker)
	case b.FirstEventID > math.MaxUint64-uint64(len(b.Events)):
		return fmt.Errorf("%w: worker %q: event ids overflow from %d", ErrInvalidBatch, b.Worker, b.FirstEventID)
	case len(b.Model) > MaxNameBytes || len(b.Worker) > MaxNameBytes:
		return fmt.Errorf("%w: model %q / worker %q longer than %d bytes", ErrInvalidBatch, b.Model, b.Worker, MaxNameBytes)
	}
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case KindStored, KindRemoved, KindCleared:
		default:
			return fmt.Errorf("%w: worker %q event %d: kind %d", ErrInvalidBatch, b.Worker, i, ev.Kind)
		}
		if len(ev.Blocks) > MaxEventBlocks || len(ev.Removed) > MaxEventBlocks || len(ev.RemovedSeqs) > MaxEventBlocks {
			return fmt.Errorf("%w: worker %q event %d: more than %d blocks", ErrInvalidBatch, b.Worker, i, MaxEventBlocks)
		}
		if err := checkKeying(&b.Events[i], b.SeqKeyed); err != nil {
			return fmt.Errorf("worker %q event %d: %w", b.Worker, i, err)
		}
	}
	return nil
}

// checkKeying refuses an event that names blocks the way the other keying
// does: its hashes would be lost or misread on the wire.
func checkKeying(ev *Event, seqKeyed bool) error {
	if !seqKeyed {
		if len(ev.RemovedSeqs) > 0 {
			return fmt.Errorf("%w: sequence-hash removals in an engine-keyed batch", ErrInvalidBatch)
		}
		return nil
	}
	if len(ev.Removed) > 0 || ev.HasParent {
		return fmt.Errorf("%w: engine hashes in a sequence-keyed batch", ErrInvalidBatch)
	}
	for _, bl := range ev.Blocks {
		if bl.Engine != 0 {
			return fmt.Errorf("%w: engine hash %#x in a sequence-keyed batch", ErrInvalidBatch, uint64(bl.Engine))
		}
	}
	return nil
}

// wireVersion is the version a batch of this keying is encoded as.
func wireVersion(seqKeyed bool) uint64 {
	if seqKeyed {
		return WireVersionSeqKeyed
	}
	return WireVersion
}

// appendKeyed appends ev encoded for a batch of the given keying.
func appendKeyed(dst []byte, ev *Event, seqKeyed bool) []byte {
	if seqKeyed {
		return appendSeqEvent(dst, ev)
	}
	return appendEvent(dst, ev)
}

func appendEvent(dst []byte, ev *Event) []byte {
	switch ev.Kind {
	case KindStored:
		dst = append(dst, 0x94, byte(KindStored))
		dst = msgpack.AppendUint(dst, uint64(ev.Tier))
		if ev.HasParent {
			dst = msgpack.AppendUint(dst, uint64(ev.Parent))
		} else {
			dst = msgpack.AppendNil(dst)
		}
		dst = msgpack.AppendArrayHeader(dst, 2*len(ev.Blocks))
		for _, bl := range ev.Blocks {
			dst = msgpack.AppendUint(dst, uint64(bl.Engine))
			dst = msgpack.AppendUint(dst, uint64(bl.Seq))
		}
	case KindRemoved:
		dst = append(dst, 0x93, byte(KindRemoved))
		dst = msgpack.AppendUint(dst, uint64(ev.Tier))
		dst = msgpack.AppendArrayHeader(dst, len(ev.Removed))
		for _, h := range ev.Removed {
			dst = msgpack.AppendUint(dst, uint64(h))
		}
	default: // KindCleared; validateBatch admitted nothing else
		dst = append(dst, 0x91, byte(KindCleared))
	}
	return dst
}

// appendSeqEvent is appendEvent for a SeqKeyed batch.
func appendSeqEvent(dst []byte, ev *Event) []byte {
	switch ev.Kind {
	case KindStored:
		dst = append(dst, 0x93, byte(KindStored))
		dst = msgpack.AppendUint(dst, uint64(ev.Tier))
		dst = msgpack.AppendArrayHeader(dst, len(ev.Blocks))
		for _, bl := range ev.Blocks {
			dst = msgpack.AppendUint(dst, uint64(bl.Seq))
		}
	case KindRemoved:
		dst = append(dst, 0x93, byte(KindRemoved))
		dst = msgpack.AppendUint(dst, uint64(ev.Tier))
		dst = msgpack.AppendArrayHeader(dst, len(ev.RemovedSeqs))
		for _, h := range ev.RemovedSeqs {
			dst = msgpack.AppendUint(dst, uint64(h))
		}
	default:
		dst = append(dst, 0x91, byte(KindCleared))
	}
	return dst
}

// DecodeBatch decodes one encoded batch into b with freshly allocated
// slices that the caller may keep. For a hot loop use a BatchDecoder.
func DecodeBatch(data []byte, b *Batch) error {
	*b = Batch{}
	if len(data) > MaxBatchBytes {
		return fmt.Errorf("%w: batch of %d bytes, limit %d", ErrOversized, len(data), MaxBatchBytes)
	}
	var d BatchDecoder // no intern table: names are plain fresh strings
	out, err := d.decode(data)
	if err != nil {
		return err
	}
	*b = out
	return nil
}

// BatchDecoder decodes batches reusing its buffers, so a steady stream of
// batches decodes without allocating. The Events (and their Blocks and
// Removed slices) it puts in a Batch alias those buffers: they are valid
// until the next Decode call. Model and worker names are interned. A
// BatchDecoder is not safe for concurrent use; the zero value is ready.
type BatchDecoder struct {
	events []Event
	blocks []StoredBlock
	hashes []EngineHash
	seqs   []SeqHash
	names  map[string]string
}

// maxInterned bounds the name intern table; it is reset when full, so a
// stream of distinct names costs allocations, never unbounded memory.
const maxInterned = 4096

// Decode decodes data into b. Errors wrap ErrTruncated, ErrMalformed,
// ErrOversized or ErrUnsupportedVersion; on error b is left zeroed.
func (d *BatchDecoder) Decode(data []byte, b *Batch) error {
	*b = Batch{}
	if len(data) > MaxBatchBytes {
		return fmt.Errorf("%w: batch of %d bytes, limit %d", ErrOversized, len(data), MaxBatchBytes)
	}
	if d.names == nil {
		d.names = make(map[string]string)
	}
	out, err := d.decode(data)
	if err != nil {
		return err
	}
	*b = out
	return nil
}

func (d *BatchDecoder) decode(data []byte) (Batch, error) {
	var b Batch
	r := msgpack.NewReader(data)
	n, err := r.ArrayLen()
	if err != nil {
		return b, err
	}
	if n < 1 {
		return b, fmt.Errorf("%w: empty batch array", ErrMalformed)
	}
	ver, err := r.Uint()
	if err != nil {
		return b, err
	}
	if ver != WireVersion && ver != WireVersionSeqKeyed {
		return b, fmt.Errorf("%w: version %d, want %d or %d", ErrUnsupportedVersion, ver, WireVersion, WireVersionSeqKeyed)
	}
	b.SeqKeyed = ver == WireVersionSeqKeyed
	if n < minBatchArrayLen {
		return b, fmt.Errorf("%w: batch array of %d elements, want at least %d", ErrMalformed, n, minBatchArrayLen)
	}
	if b.Model, err = d.name(&r, "model"); err != nil {
		return b, err
	}
	if b.Worker, err = d.name(&r, "worker"); err != nil {
		return b, err
	}
	if b.Rank, err = r.Uint32(); err != nil {
		return b, err
	}
	if b.Epoch, err = r.Uint(); err != nil {
		return b, err
	}
	if b.FirstEventID, err = r.Uint(); err != nil {
		return b, err
	}
	ne, err := r.ArrayLen()
	if err != nil {
		return b, err
	}
	switch {
	case ne == 0:
		return b, fmt.Errorf("%w: worker %q: batch without events", ErrMalformed, b.Worker)
	case ne > MaxBatchEvents:
		return b, fmt.Errorf("%w: worker %q: %d events, limit %d", ErrOversized, b.Worker, ne, MaxBatchEvents)
	case b.FirstEventID == 0:
		return b, fmt.Errorf("%w: worker %q: first event id 0", ErrMalformed, b.Worker)
	case b.FirstEventID > math.MaxUint64-uint64(ne):
		return b, fmt.Errorf("%w: worker %q: event ids overflow from %d", ErrMalformed, b.Worker, b.FirstEventID)
	}
	events := d.events[:0]
	bufs := eventBufs{blocks: d.blocks[:0], hashes: d.hashes[:0], seqs: d.seqs[:0], seqKeyed: b.SeqKeyed}
	for i := 0; i < ne; i++ {
		var ev Event
		if ev, err = bufs.decodeEvent(&r); err != nil {
			return b, fmt.Errorf("worker %q event %d: %w", b.Worker, i, err)
		}
		events = append(events, ev)
	}
	// Trailing batch fields from a later minor revision are skipped.
	for i := minBatchArrayLen; i < n; i++ {
		if err := r.Skip(); err != nil {
			return b, err
		}
	}
	if r.Remaining() != 0 {
		return b, fmt.Errorf("%w: %d trailing bytes after the batch", ErrMalformed, r.Remaining())
	}
	d.events, d.blocks, d.hashes, d.seqs = events, bufs.blocks, bufs.hashes, bufs.seqs
	b.Events = events
	return b, nil
}

// name reads a model or worker name, interned through d.names.
func (d *BatchDecoder) name(r *msgpack.Reader, what string) (string, error) {
	p, err := r.Str()
	if err != nil {
		return "", err
	}
	if len(p) > MaxNameBytes {
		return "", fmt.Errorf("%w: %s of %d bytes, limit %d", ErrOversized, what, len(p), MaxNameBytes)
	}
	if d.names == nil {
		return string(p), nil
	}
	if s, ok := d.names[string(p)]; ok {
		return s, nil
	}
	if len(d.names) >= maxInterned {
		clear(d.names)
	}
	s := string(p)
	d.names[s] = s
	return s, nil
}

// eventBufs holds the slices one batch's events are decoded into: each
// event's Blocks, Removed or RemovedSeqs is a subslice of them.
type eventBufs struct {
	blocks   []StoredBlock
	hashes   []EngineHash
	seqs     []SeqHash
	seqKeyed bool // the batch is wire version 2
}

// decodeEvent decodes one event. An unknown kind is kept as an Event with
// only Kind set, so event ids stay aligned with positions; sinks ignore
// kinds they do not know. Fields a later minor revision appends to the
// event array are skipped.
func (d *eventBufs) decodeEvent(r *msgpack.Reader) (Event, error) {
	var ev Event
	n, err := r.ArrayLen()
	if err != nil {
		return ev, err
	}
	if n < 1 {
		return ev, fmt.Errorf("%w: empty event array", ErrMalformed)
	}
	kind, err := r.Uint()
	if err != nil {
		return ev, err
	}
	if kind > math.MaxUint8 {
		return ev, fmt.Errorf("%w: event kind %d", ErrMalformed, kind)
	}
	ev.Kind = EventKind(kind)
	used := 1
	switch {
	case ev.Kind != KindStored && ev.Kind != KindRemoved:
	case d.seqKeyed:
		if n < minSeqEventArrayLen {
			return ev, fmt.Errorf("%w: %s event of %d elements, want %d", ErrMalformed, ev.Kind, n, minSeqEventArrayLen)
		}
		err = d.seqEvent(r, &ev)
		used = minSeqEventArrayLen
	case ev.Kind == KindStored:
		if n < minStoredArrayLen {
			return ev, fmt.Errorf("%w: stored event of %d elements, want %d", ErrMalformed, n, minStoredArrayLen)
		}
		err = d.stored(r, &ev)
		used = minStoredArrayLen
	default:
		if n < minRemovedArrayLn {
			return ev, fmt.Errorf("%w: removed event of %d elements, want %d", ErrMalformed, n, minRemovedArrayLn)
		}
		err = d.removed(r, &ev)
		used = minRemovedArrayLn
	}
	if err != nil {
		return ev, err
	}
	for ; used < n; used++ {
		if err := r.Skip(); err != nil {
			return ev, err
		}
	}
	return ev, nil
}

// stored reads an engine-keyed stored event's tier, parent and block pairs
// after its kind.
func (d *eventBufs) stored(r *msgpack.Reader, ev *Event) error {
	var err error
	if ev.Tier, err = readTier(r); err != nil {
		return err
	}
	if !r.NextIsNil() {
		p, err := r.Uint()
		if err != nil {
			return err
		}
		ev.Parent, ev.HasParent = EngineHash(p), true
	}
	m, err := r.ArrayLen()
	if err != nil {
		return err
	}
	if m%2 != 0 {
		return fmt.Errorf("%w: stored event with odd block array length %d", ErrMalformed, m)
	}
	if m/2 > MaxEventBlocks {
		return fmt.Errorf("%w: %d blocks, limit %d", ErrOversized, m/2, MaxEventBlocks)
	}
	start := len(d.blocks)
	for j := 0; j < m/2; j++ {
		e, err := r.Uint()
		if err != nil {
			return err
		}
		s, err := r.Uint()
		if err != nil {
			return err
		}
		d.blocks = append(d.blocks, StoredBlock{Engine: EngineHash(e), Seq: SeqHash(s)})
	}
	ev.Blocks = d.blocks[start:len(d.blocks):len(d.blocks)]
	return nil
}

// removed reads an engine-keyed removed event's tier and engine hashes
// after its kind.
func (d *eventBufs) removed(r *msgpack.Reader, ev *Event) error {
	m, err := tierAndCount(r, ev)
	if err != nil {
		return err
	}
	start := len(d.hashes)
	if d.hashes, err = appendUints(r, d.hashes, m); err != nil {
		return err
	}
	ev.Removed = d.hashes[start:len(d.hashes):len(d.hashes)]
	return nil
}

// tierAndCount reads an event's tier into ev and the length of the hash
// array that follows it, within MaxEventBlocks.
func tierAndCount(r *msgpack.Reader, ev *Event) (int, error) {
	var err error
	if ev.Tier, err = readTier(r); err != nil {
		return 0, err
	}
	m, err := r.ArrayLen()
	if err != nil {
		return 0, err
	}
	if m > MaxEventBlocks {
		return 0, fmt.Errorf("%w: %d %s hashes, limit %d", ErrOversized, m, ev.Kind, MaxEventBlocks)
	}
	return m, nil
}

// appendUints reads m unsigned integers into dst.
func appendUints[T ~uint64](r *msgpack.Reader, dst []T, m int) ([]T, error) {
	for j := 0; j < m; j++ {
		v, err := r.Uint()
		if err != nil {
			return dst, err
		}
		dst = append(dst, T(v))
	}
	return dst, nil
}

// seqEvent reads a sequence-keyed stored or removed event's tier and
// sequence hashes after its kind: stored ones become Blocks (Engine 0),
// removed ones RemovedSeqs.
func (d *eventBufs) seqEvent(r *msgpack.Reader, ev *Event) error {
	m, err := tierAndCount(r, ev)
	if err != nil {
		return err
	}
	if ev.Kind == KindStored {
		start := len(d.blocks)
		for j := 0; j < m; j++ {
			s, err := r.Uint()
			if err != nil {
				return err
			}
			d.blocks = append(d.blocks, StoredBlock{Seq: SeqHash(s)})
		}
		ev.Blocks = d.blocks[start:len(d.blocks):len(d.blocks)]
		return nil
	}
	start := len(d.seqs)
	if d.seqs, err = appendUints(r, d.seqs, m); err != nil {
		return err
	}
	ev.RemovedSeqs = d.seqs[start:len(d.seqs):len(d.seqs)]
	return nil
}

func readTier(r *msgpack.Reader) (Tier, error) {
	t, err := r.Uint()
	if err != nil {
		return 0, err
	}
	if t > math.MaxUint8 {
		return 0, fmt.Errorf("%w: tier %d", ErrMalformed, t)
	}
	return Tier(t), nil
}
