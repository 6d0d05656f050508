package sim

import (
	"errors"
	"fmt"

	"github.com/kvrouter/kvrouter/kvevents"
)

// Multimodal prompts. A request's Media items (the placeholder ranges of
// its images, with their identifiers) enter its blocks' hashes as vLLM's
// extra keys do (kvevents.SeqHashesMedia), so two prompts whose
// placeholder tokens are equal but whose images differ never share a
// cached block from the first block an image overlaps; an emitter that
// publishes vLLM events writes the blocks' (identifier, offset) pairs in
// extra_keys (BlockKeys.Media).

// ErrBadMedia: a request's media items are not sorted, disjoint, non-empty
// ranges inside its prompt, each with an identifier.
var ErrBadMedia = errors.New("sim: bad media items")

// checkMedia validates a request's media items against its prompt length.
func checkMedia(items []kvevents.MediaItem, promptLen int) error {
	end := 0
	for i, it := range items {
		switch {
		case it.ID == "":
			return fmt.Errorf("%w: item %d has no identifier", ErrBadMedia, i)
		case it.Length < 1 || it.Offset < end || it.Offset+it.Length > promptLen:
			return fmt.Errorf("%w: item %d (offset %d, length %d) after position %d in a prompt of %d tokens",
				ErrBadMedia, i, it.Offset, it.Length, end, promptLen)
		}
		end = it.Offset + it.Length
	}
	return nil
}

// emitStoredMedia emits the Stored event of r's blocks [start,
// start+len(ev.Blocks)) with their keys, the media pairs included.
func (c *core) emitStoredMedia(ev kvevents.Event, r *request, start int) {
	bs := c.cfg.BlockSize
	tokens := r.tokens[start*bs : (start+len(ev.Blocks))*bs]
	keys := r.keysFrom(start)
	if len(r.media) > 0 {
		c.mediaBuf = kvevents.AppendMediaKeys(c.mediaBuf[:0], r.media, start*bs, len(ev.Blocks), bs)
		keys.Media = c.mediaBuf
	}
	c.emitStored(ev, tokens, keys)
}
