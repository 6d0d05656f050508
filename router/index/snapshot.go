package index

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// Snapshot format, versions 1 and 2 (all integers little-endian; "uvarint"
// is encoding/binary's unsigned varint). Documented in docs/protocol.md.
// Version 2 adds the keying byte; it is written only when some worker is
// sequence-keyed, so a snapshot of engine-keyed workers stays readable by
// a build that reads version 1 only.
//
//	magic      4 bytes  "KVRI"
//	version    u16      1 or 2
//	flags      u16      0 (reserved; must be 0)
//	streamSeq  u64      every event at or below it is reflected
//	model      uvarint length + bytes
//	tier       u8       the tier the index scores
//	workers    uvarint  count, then per worker, sorted by (name, rank):
//	  name        uvarint length + bytes (1..MaxWorkerNameLen)
//	  rank        uvarint (< 2^32)
//	  epoch       u64      the worker's cursor: epoch of its last batch
//	  nextEventID u64      and the id of the next event expected (0 = none)
//	  keying      u8       version 2 only: 0 engine-keyed, 1 sequence-keyed
//	  blocks      uvarint count, then count × (engine u64, seq u64),
//	              strictly increasing by engine hash; sequence-keyed:
//	              count × seq u64, strictly increasing
//	crc        u32      CRC-32C (Castagnoli) of every byte before it
const (
	snapshotMagic = "KVRI"
	// snapshotVersion is the version written when no worker is
	// sequence-keyed, snapshotVersionKeyed the one written otherwise.
	snapshotVersion      = 1
	snapshotVersionKeyed = 2
	// MaxWorkerNameLen bounds a worker name in a snapshot.
	MaxWorkerNameLen = 1024
	// MaxModelNameLen bounds the model name in a snapshot.
	MaxModelNameLen = 1024

	snapshotHeaderLen = 4 + 2 + 2 + 8
	minWorkerLen      = 1 + 1 + 1 + 8 + 8 + 1 // name len, name, rank, epoch, next id, count
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot is a decoded snapshot: the state of every (worker, rank) and
// the stream sequence it covers.
type Snapshot struct {
	StreamSeq uint64
	Model     string
	Tier      kvevents.Tier
	Workers   []WorkerDump // sorted by key; blocks sorted by engine hash
}

// Entries is the number of (block, engine hash) pairs in s.
func (s *Snapshot) Entries() int {
	n := 0
	for i := range s.Workers {
		n += len(s.Workers[i].Blocks)
	}
	return n
}

// Snapshot captures the index and the stream sequence it covers. It does
// not stop event application: it reads StreamSeq first, then each worker
// under that worker's lock, so every worker's state is at or after
// StreamSeq. Replaying the stream from StreamSeq+1 on a restored copy
// re-applies some events a worker already reflects, which is harmless
// (each (worker, engine hash) ends in the state of the last event that
// touched it either way).
func (x *Index) Snapshot() *Snapshot {
	seq := x.StreamSeq()
	return &Snapshot{StreamSeq: seq, Model: x.cfg.Model, Tier: x.cfg.Tier, Workers: x.Dump()}
}

// MarshalBinary encodes s: version 1 when every worker is engine-keyed,
// else version 2.
func (s *Snapshot) MarshalBinary() ([]byte, error) {
	version := uint16(snapshotVersion)
	for i := range s.Workers {
		if s.Workers[i].SeqKeyed {
			version = snapshotVersionKeyed
		}
	}
	size := snapshotHeaderLen + binary.MaxVarintLen64 + len(s.Model) + 1 + binary.MaxVarintLen64 + 4
	for i := range s.Workers {
		size += 3*binary.MaxVarintLen64 + len(s.Workers[i].Key.Worker) + 16 + 16*len(s.Workers[i].Blocks)
	}
	b := make([]byte, 0, size)
	b = append(b, snapshotMagic...)
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, s.StreamSeq)
	if len(s.Model) > MaxModelNameLen {
		return nil, fmt.Errorf("index: model name of %d bytes exceeds %d", len(s.Model), MaxModelNameLen)
	}
	b = binary.AppendUvarint(b, uint64(len(s.Model)))
	b = append(b, s.Model...)
	b = append(b, byte(s.Tier))
	ws := slices.Clone(s.Workers)
	slices.SortFunc(ws, func(a, b WorkerDump) int { return cmpKey(a.Key, b.Key) })
	b = binary.AppendUvarint(b, uint64(len(ws)))
	for i := range ws {
		w := &ws[i]
		if n := len(w.Key.Worker); n == 0 || n > MaxWorkerNameLen {
			return nil, fmt.Errorf("index: worker name %q: length %d outside 1..%d", w.Key.Worker, n, MaxWorkerNameLen)
		}
		if i > 0 && ws[i-1].Key == w.Key {
			return nil, fmt.Errorf("index: worker %v appears twice", w.Key)
		}
		b = binary.AppendUvarint(b, uint64(len(w.Key.Worker)))
		b = append(b, w.Key.Worker...)
		b = binary.AppendUvarint(b, uint64(w.Key.Rank))
		b = binary.LittleEndian.AppendUint64(b, w.Cursor.Epoch)
		b = binary.LittleEndian.AppendUint64(b, w.Cursor.NextID)
		if version == snapshotVersionKeyed {
			b = append(b, keyingByte(w.SeqKeyed))
		}
		blocks := w.Blocks
		if !slices.IsSortedFunc(blocks, cmpBlock) {
			blocks = slices.Clone(blocks)
			slices.SortFunc(blocks, cmpBlock)
		}
		b = binary.AppendUvarint(b, uint64(len(blocks)))
		if w.SeqKeyed {
			for j, blk := range blocks {
				if blk.Engine != 0 || (j > 0 && blocks[j-1].Seq == blk.Seq) {
					return nil, fmt.Errorf("index: sequence-keyed worker %v: block %x with engine hash %x or repeated", w.Key, blk.Seq, blk.Engine)
				}
				b = binary.LittleEndian.AppendUint64(b, uint64(blk.Seq))
			}
			continue
		}
		for j, blk := range blocks {
			if j > 0 && blocks[j-1].Engine == blk.Engine {
				return nil, fmt.Errorf("index: worker %v: engine hash %x appears twice", w.Key, blk.Engine)
			}
			b = binary.LittleEndian.AppendUint64(b, uint64(blk.Engine))
			b = binary.LittleEndian.AppendUint64(b, uint64(blk.Seq))
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

func keyingByte(seqKeyed bool) byte {
	if seqKeyed {
		return 1
	}
	return 0
}

// snapReader is a bounds-checked cursor over snapshot bytes.
type snapReader struct {
	b       []byte
	off     int
	version uint16
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrSnapshotCorrupt}, args...)...)
}

func (r *snapReader) left() int { return len(r.b) - r.off }

func (r *snapReader) u64(what string) (uint64, error) {
	if r.left() < 8 {
		return 0, corrupt("%s at offset %d: need 8 bytes, have %d", what, r.off, r.left())
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v, nil
}

func (r *snapReader) uvarint(what string) (uint64, error) {
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		return 0, corrupt("%s at offset %d: bad varint", what, r.off)
	}
	r.off += n
	return v, nil
}

func (r *snapReader) str(what string, maxLen int) (string, error) {
	n, err := r.uvarint(what + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(maxLen) || n > uint64(r.left()) {
		return "", corrupt("%s at offset %d: length %d exceeds limit %d or the %d bytes left", what, r.off, n, maxLen, r.left())
	}
	s := string(r.b[r.off : r.off+int(n)])
	r.off += int(n)
	return s, nil
}

// DecodeSnapshot parses and validates snapshot bytes. Every length and
// count is checked against the bytes left before anything is allocated for
// it, so hostile input costs at most its own size. Errors wrap
// ErrSnapshotCorrupt or ErrSnapshotVersion.
func DecodeSnapshot(data []byte) (*Snapshot, error) {
	body, err := snapshotBody(data)
	if err != nil {
		return nil, err
	}
	r := &snapReader{b: body, off: 8, version: binary.LittleEndian.Uint16(data[4:])} // after magic, version and flags
	s := &Snapshot{}
	if err := r.header(s); err != nil {
		return nil, err
	}
	nw, err := r.uvarint("worker count")
	if err != nil {
		return nil, err
	}
	if nw > uint64(r.left()/minWorkerLen) {
		return nil, corrupt("worker count %d cannot fit in %d bytes", nw, r.left())
	}
	s.Workers = make([]WorkerDump, 0, nw)
	for i := uint64(0); i < nw; i++ {
		var w WorkerDump
		if w.Key, err = r.workerKey(i); err != nil {
			return nil, err
		}
		if i > 0 && cmpKey(s.Workers[i-1].Key, w.Key) >= 0 {
			return nil, corrupt("worker %v out of order or repeated after %v", w.Key, s.Workers[i-1].Key)
		}
		if err := r.workerState(&w); err != nil {
			return nil, err
		}
		s.Workers = append(s.Workers, w)
	}
	if r.left() != 0 {
		return nil, corrupt("%d trailing bytes", r.left())
	}
	if r.version == snapshotVersionKeyed && !slices.ContainsFunc(s.Workers, func(w WorkerDump) bool { return w.SeqKeyed }) {
		// MarshalBinary writes version 1 then: one state, one encoding.
		return nil, corrupt("version %d without a sequence-keyed worker", r.version)
	}
	return s, nil
}

// snapshotBody checks the frame of data (magic, version, checksum, flags)
// and returns it without its checksum.
func snapshotBody(data []byte) ([]byte, error) {
	if len(data) < snapshotHeaderLen+4 {
		return nil, corrupt("%d bytes is shorter than header and checksum", len(data))
	}
	if string(data[:4]) != snapshotMagic {
		return nil, corrupt("bad magic %q", data[:4])
	}
	if v := binary.LittleEndian.Uint16(data[4:]); v != snapshotVersion && v != snapshotVersionKeyed {
		return nil, fmt.Errorf("%w: version %d (this build reads %d and %d)", ErrSnapshotVersion, v, snapshotVersion, snapshotVersionKeyed)
	}
	body := data[:len(data)-4]
	if want, got := binary.LittleEndian.Uint32(data[len(data)-4:]), crc32.Checksum(body, castagnoli); want != got {
		return nil, corrupt("checksum %08x, computed %08x", want, got)
	}
	if f := binary.LittleEndian.Uint16(data[6:]); f != 0 {
		return nil, corrupt("unknown flags %#x", f)
	}
	return body, nil
}

// header reads the snapshot's stream sequence, model and tier into s.
func (r *snapReader) header(s *Snapshot) error {
	var err error
	if s.StreamSeq, err = r.u64("stream sequence"); err != nil {
		return err
	}
	if s.Model, err = r.str("model", MaxModelNameLen); err != nil {
		return err
	}
	if r.left() < 1 {
		return corrupt("tier at offset %d: missing", r.off)
	}
	s.Tier = kvevents.Tier(r.b[r.off])
	r.off++
	if s.Tier > kvevents.TierExternal {
		return corrupt("unknown tier %d", s.Tier)
	}
	return nil
}

// workerKey reads the name and rank of worker i.
func (r *snapReader) workerKey(i uint64) (workerref.Target, error) {
	var k workerref.Target
	var err error
	if k.Worker, err = r.str("worker name", MaxWorkerNameLen); err != nil {
		return k, err
	}
	if k.Worker == "" {
		return k, corrupt("worker %d has an empty name", i)
	}
	rank, err := r.uvarint("rank")
	if err != nil {
		return k, err
	}
	if rank > 1<<32-1 {
		return k, corrupt("worker %q: rank %d exceeds 32 bits", k.Worker, rank)
	}
	k.Rank = uint32(rank)
	return k, nil
}

// workerState reads w's event cursor and its blocks, which must be in
// strictly increasing engine-hash order.
func (r *snapReader) workerState(w *WorkerDump) error {
	var err error
	if w.Cursor.Epoch, err = r.u64("epoch"); err != nil {
		return err
	}
	if w.Cursor.NextID, err = r.u64("next event id"); err != nil {
		return err
	}
	if r.version == snapshotVersionKeyed {
		if r.left() < 1 {
			return corrupt("worker %v: keying missing", w.Key)
		}
		switch r.b[r.off] {
		case 0:
		case 1:
			w.SeqKeyed = true
		default:
			return corrupt("worker %v: keying %d", w.Key, r.b[r.off])
		}
		r.off++
	}
	nb, err := r.uvarint("block count")
	if err != nil {
		return err
	}
	if w.SeqKeyed {
		return r.seqBlocks(w, nb)
	}
	if nb > uint64(r.left()/16) {
		return corrupt("worker %v: block count %d cannot fit in %d bytes", w.Key, nb, r.left())
	}
	w.Blocks = make([]kvevents.StoredBlock, nb)
	for j := range w.Blocks {
		e := binary.LittleEndian.Uint64(r.b[r.off:])
		sq := binary.LittleEndian.Uint64(r.b[r.off+8:])
		r.off += 16
		if j > 0 && e <= uint64(w.Blocks[j-1].Engine) {
			return corrupt("worker %v: engine hash %x out of order", w.Key, e)
		}
		w.Blocks[j] = kvevents.StoredBlock{Engine: kvevents.EngineHash(e), Seq: kvevents.SeqHash(sq)}
	}
	return nil
}

// seqBlocks reads a sequence-keyed worker's nb sequence hashes, strictly
// increasing.
func (r *snapReader) seqBlocks(w *WorkerDump, nb uint64) error {
	if nb > uint64(r.left()/8) {
		return corrupt("worker %v: block count %d cannot fit in %d bytes", w.Key, nb, r.left())
	}
	w.Blocks = make([]kvevents.StoredBlock, nb)
	for j := range w.Blocks {
		sq := binary.LittleEndian.Uint64(r.b[r.off:])
		r.off += 8
		if j > 0 && sq <= uint64(w.Blocks[j-1].Seq) {
			return corrupt("worker %v: sequence hash %x out of order", w.Key, sq)
		}
		w.Blocks[j] = kvevents.StoredBlock{Seq: kvevents.SeqHash(sq)}
	}
	return nil
}

// Restore loads s into x, which must hold no workers (ErrNotEmpty), and
// sets x's stream sequence to s.StreamSeq: replay the event stream from
// s.StreamSeq+1 next. A snapshot for another model than Config.Model (when
// both are set) or another tier is refused.
func (x *Index) Restore(s *Snapshot) error {
	if x.cfg.Model != "" && s.Model != "" && s.Model != x.cfg.Model {
		return fmt.Errorf("%w: snapshot model %q, index model %q", ErrSnapshotMismatch, s.Model, x.cfg.Model)
	}
	if s.Tier != x.cfg.Tier {
		return fmt.Errorf("%w: snapshot tier %v, index tier %v", ErrSnapshotMismatch, s.Tier, x.cfg.Tier)
	}
	x.wmu.Lock()
	n := len(x.workers)
	x.wmu.Unlock()
	if n != 0 {
		return fmt.Errorf("%w: %d workers present", ErrNotEmpty, n)
	}
	for i := range s.Workers {
		w := &s.Workers[i]
		x.loadWorker(w.Key, w.Cursor, w.Blocks, w.SeqKeyed)
	}
	x.noteSeq(s.StreamSeq)
	return nil
}
