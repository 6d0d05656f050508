package vllm

import (
	"fmt"

	"github.com/kvrouter/kvrouter/internal/msgpack"
	"github.com/kvrouter/kvrouter/kvevents"
)

// Multimodal extra keys. vLLM gives every block that overlaps a multimodal
// item's placeholder tokens the pair (mm_identifier, offset) in its
// extra_keys entry, between the LoRA name and the cache salt; msgspec
// writes the tuple as a two-element array [str, int]. The decoder keeps
// the pairs per block (Event.Media), the converter mixes them into the
// blocks' hashes exactly as the router does for the same items
// (kvevents.SeqHashesKeyed), and the encoder writes them back for the
// simulated engine.

// Limits on multimodal pairs, enforced while decoding.
const (
	// maxMediaKeys bounds the pairs of one batch (a block holds a few;
	// a batch of a 200k-token prompt with images some thousands).
	maxMediaKeys = 1 << 18
	// maxMediaOffset bounds |offset|: no prompt is longer.
	maxMediaOffset = 1 << 40
)

// mediaPair reads one multimodal pair of block's extra_keys entry into
// d.media. A pair that is not [str, int] marks the event BadMedia (its
// hashes cannot be known) and is skipped; only unreadable msgpack is an
// error.
func (d *decoder) mediaPair(ev *Event, block int) error {
	r := &d.r
	n, err := r.ArrayLen()
	if err != nil {
		return err
	}
	skip := func(from int) error {
		ev.BadMedia = true
		for ; from < n; from++ {
			if err := r.Skip(); err != nil {
				return err
			}
		}
		return nil
	}
	if n != 2 {
		return skip(0)
	}
	c, err := r.Peek()
	if err != nil {
		return err
	}
	if !msgpack.IsStr(c) {
		return skip(0)
	}
	id, err := r.Str()
	if err != nil {
		return err
	}
	c, err = r.Peek()
	if err != nil {
		return err
	}
	if !isInt(c) {
		return skip(1)
	}
	off, err := r.Int64()
	if err != nil {
		return err
	}
	if off > maxMediaOffset || off < -maxMediaOffset {
		ev.BadMedia = true
		return nil
	}
	if len(d.media) >= maxMediaKeys {
		return fmt.Errorf("%w: more than %d multimodal extra keys in one vLLM batch", kvevents.ErrOversized, maxMediaKeys)
	}
	d.media = append(d.media, kvevents.MediaKey{Block: block, ID: d.intern(id), Offset: int(off)})
	return nil
}

// isInt reports whether c starts a msgpack integer.
func isInt(c byte) bool {
	return c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xcf) || (c >= 0xd0 && c <= 0xd3)
}

// mediaHashes returns the sequence hashes of a BlockStored with multimodal
// pairs into c.seqs: its blocks' local hashes with the pairs mixed in,
// chained onto parent when it has one. Pairs naming a block the event does
// not have (more extra_keys entries than blocks) make it unhashable.
func (c *Converter) mediaHashes(ev *Event, parent kvevents.SeqHash, seed uint64) error {
	if ev.ExtraKeyCount != len(ev.BlockHashes) {
		return fmt.Errorf("%w: %d extra_keys entries for %d blocks", ErrBadMedia, ev.ExtraKeyCount, len(ev.BlockHashes))
	}
	c.seqs = kvevents.SeqHashesKeyed(c.seqs[:0], parent, ev.HasParent, ev.TokenIDs, c.cfg.BlockSize, seed, ev.Media)
	return nil
}

// appendMediaPairs writes multimodal pairs as msgspec writes the tuples:
// [identifier, offset].
func appendMediaPairs(dst []byte, pairs []kvevents.MediaKey) []byte {
	for _, p := range pairs {
		dst = msgpack.AppendArrayHeader(dst, 2)
		dst = msgpack.AppendStr(dst, p.ID)
		dst = msgpack.AppendInt(dst, int64(p.Offset))
	}
	return dst
}
