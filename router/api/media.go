package api

import (
	"strconv"

	"github.com/kvrouter/kvrouter/kvevents"
)

// The media field of a route request and the rule that turns a request's
// token ids into the sequence hashes a replica looks up: one function
// (RouteRequest.SeqHashes) that the replica and the clients that hash on
// their side (the gateway for long prompts) share.

// Limits on the media field. Larger values are rejected with a bad_request
// error naming the field.
const (
	MaxMediaItems = 4096 // entries in media
	MaxMediaIDLen = 1024 // bytes of one identifier
)

// SeqHashes appends the sequence hashes of r's token ids at blockSize
// tokens per block: kvevents' definition, seeded with r's LoRA name and
// cache salt (kvevents.SeedFor), with r's media items mixed into the blocks
// that overlap them (kvevents.SeqHashesMedia; the hashes stop before the
// first item whose identifier is unknown). It is what a replica computes
// for token_ids, and what a client sends as block_hashes in their place.
func (r *RouteRequest) SeqHashes(dst []kvevents.SeqHash, blockSize int) []kvevents.SeqHash {
	seed := uint64(kvevents.HashSeed)
	if r.LoraName != "" || r.CacheSalt != "" {
		seed = kvevents.SeedFor(r.LoraName, r.CacheSalt)
	}
	return kvevents.SeqHashesMedia(dst, r.TokenIDs, blockSize, seed, r.Media)
}

// CheckMedia validates r's media items against its token ids: they come
// with token_ids only, sorted by offset, disjoint, each at least one token
// long and inside the prompt. The error names the field.
func (r *RouteRequest) CheckMedia() *Error {
	if len(r.Media) == 0 {
		return nil
	}
	if len(r.TokenIDs) == 0 {
		return BadField("media", "needs token_ids (with block_hashes the caller has hashed the items in)")
	}
	end := 0
	for i, it := range r.Media {
		switch {
		case it.Length < 1:
			return BadField("media", "item %d has length %d: want at least 1 placeholder token", i, it.Length)
		case it.Offset < end:
			return BadField("media", "item %d at offset %d starts before the end of the previous item (%d): items must be sorted and disjoint", i, it.Offset, end)
		case it.Offset+it.Length > len(r.TokenIDs):
			return BadField("media", "item %d (offset %d, length %d) ends past the prompt's %d tokens", i, it.Offset, it.Length, len(r.TokenIDs))
		}
		end = it.Offset + it.Length
	}
	return nil
}

// appendMedia appends items as a JSON array, as encoding/json writes
// kvevents.MediaItem.
func appendMedia(dst []byte, items []kvevents.MediaItem) []byte {
	dst = append(dst, '[')
	for i, it := range items {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '{')
		if it.ID != "" {
			dst = append(dst, `"id":`...)
			dst = AppendJSONString(dst, it.ID)
			dst = append(dst, ',')
		}
		dst = append(dst, `"offset":`...)
		dst = strconv.AppendInt(dst, int64(it.Offset), 10)
		dst = append(dst, `,"length":`...)
		dst = strconv.AppendInt(dst, int64(it.Length), 10)
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// media reads the media array into dst.
func (d *decoder) media(dst []kvevents.MediaItem) ([]kvevents.MediaItem, *Error) {
	dst = dst[:0]
	e := d.array("media", func(i int) *Error {
		if i >= MaxMediaItems {
			return d.errf("media", "has more than %d entries", MaxMediaItems)
		}
		var it kvevents.MediaItem
		e := d.object("media", func(key []byte) *Error {
			if d.isNull() {
				return nil
			}
			var e *Error
			switch string(key) {
			case "id":
				it.ID, e = d.str("media.id", MaxMediaIDLen)
			case "offset":
				var v uint64
				v, e = d.uint("media.offset", MaxTokens, false)
				it.Offset = int(v)
			case "length":
				var v uint64
				v, e = d.uint("media.length", MaxTokens, false)
				it.Length = int(v)
			default:
				e = d.skipValue("media." + string(key))
			}
			return e
		})
		dst = append(dst, it)
		return e
	})
	return dst, e
}

// routeHeadroom is the room a route message leaves under the server's
// max_payload for its headers (trace context and baggage).
const routeHeadroom = 4 << 10

// MaxRouteBody is the largest route request body this client sends: the
// NATS server's max_payload, which the connection learnt from the server's
// INFO when it connected, less room for headers, and at most
// MaxRouteBodySize (what a replica decodes).
func (c *Client) MaxRouteBody() int {
	mp := int(c.nc.MaxPayload())
	if mp <= 0 {
		return MaxRouteBodySize
	}
	return min(mp-routeHeadroom, MaxRouteBodySize)
}

// AsBlockHashes returns r with its token ids replaced by their sequence
// block hashes at blockSize (SeqHashes: what a replica would compute, with
// r's adapter, salt and media), its prompt length as input_tokens, and no
// token ids or media left: the request as block hashes.
func (r *RouteRequest) AsBlockHashes(blockSize int) RouteRequest {
	short := *r
	hashes := r.SeqHashes(nil, blockSize)
	short.TokenIDs, short.Media = nil, nil
	short.BlockHashes = make([]uint64, len(hashes))
	for i, h := range hashes {
		short.BlockHashes[i] = uint64(h)
	}
	short.BlockSize, short.InputTokens = blockSize, len(r.TokenIDs)
	return short
}

// fitRoute returns body (req encoded) when it fits in limit bytes.
// Otherwise, for a request with token ids and a block size, it encodes
// req's sequence block hashes in their place (RouteRequest.SeqHashes:
// exactly what the replica would compute; in the hash trailer, an eighth
// of the token trailer's bytes at 16 tokens a block) with the prompt
// length as input_tokens, into body's memory. A request that does not fit
// even so, or that gives no block size to hash at, is a payload_too_large
// *Error: it is not sent.
func fitRoute(body []byte, req *RouteRequest, limit int) ([]byte, error) {
	if len(body) <= limit {
		return body, nil
	}
	if len(req.TokenIDs) == 0 || req.BlockSize <= 0 {
		return body, NewError(CodePayloadTooLarge, "the route request is "+strconv.Itoa(len(body))+
			" bytes, the NATS server's max_payload allows "+strconv.Itoa(limit)+
			"; give block_size with token_ids so that the client can send block hashes instead", nil)
	}
	short := req.AsBlockHashes(req.BlockSize)
	body = AppendRouteBody(body[:0], &short)
	if n := len(short.BlockHashes); len(body) > limit || n > MaxBlockHashes {
		return body, NewError(CodePayloadTooLarge, "the prompt of "+strconv.Itoa(len(req.TokenIDs))+" tokens needs "+
			strconv.Itoa(len(body))+" bytes even as "+strconv.Itoa(n)+" block hashes; the NATS server's max_payload allows "+
			strconv.Itoa(limit)+" (raise max_payload, docs/gateway.md \"Long prompts\")", nil)
	}
	return body, nil
}

// MaxPromptTokens is the longest prompt a client can route in a body of
// at most maxBody bytes, at blockSize tokens a block: as block hashes (8
// bytes each in the hash trailer, after 4 KiB for the other fields and the
// mark) and at most MaxBlockHashes of them. It is the
// limit docs/gateway.md states and `kvrouter gateway` prints at start.
func MaxPromptTokens(maxBody, blockSize int) int {
	if blockSize < 1 {
		return 0
	}
	blocks := min(max(maxBody-4097, 0)/8, MaxBlockHashes)
	return min(blocks*blockSize, MaxTokens)
}
