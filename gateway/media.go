package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
)

// Chats with media (images, audio, video content parts). Their placeholder
// tokens are equal for different items; the engine tells the items apart
// by the identifiers it mixes into the blocks that overlap them (vLLM's
// extra_keys), so the router can only match past an item whose identifier
// and position it knows. The gateway learns them, most exact first:
//
//  1. the engine's render endpoint (POST /v1/chat/completions/render, newer
//     vLLM) answers the exact token ids with "features": every item's hash
//     and placeholder range. Items then carry the engine's hashes (or the
//     client's uuid where the engine gives none), and the router hashes
//     the whole prompt exactly;
//  2. without one (404), the gateway knows where the first item starts but
//     not what comes after it in the engine's hash: /tokenize of the chat
//     and of the same chat without its media parts agree up to the first
//     item's placeholders and differ there. The route carries that
//     position as an item with no identifier, and the router matches only
//     the blocks before it (kvevents.SeqHashesMedia), never more, whether
//     or not the client gave uuids (their positions are not known).

// mediaPartTypes are the content part types that carry a multimodal item
// in vLLM's chat API.
var mediaPartTypes = map[string]bool{
	"image_url": true, "video_url": true, "audio_url": true, "input_audio": true,
	"image_embeds": true, "image_pil": true,
}

// mediaPart is one multimodal content part of a request: its uuid, when
// the client gave one.
type mediaPart struct {
	uuid string
}

// chatMediaParts returns the request's multimodal content parts, in
// prompt order (nil for a chat without any).
func chatMediaParts(messages json.RawMessage) []mediaPart {
	if !bytes.Contains(messages, []byte(`"type"`)) {
		return nil // no content parts at all: the common case costs one scan
	}
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(messages, &msgs) != nil {
		return nil
	}
	var out []mediaPart
	for _, m := range msgs {
		var parts []struct {
			Type string  `json:"type"`
			UUID *string `json:"uuid"`
		}
		if len(bytes.TrimSpace(m.Content)) == 0 || json.Unmarshal(m.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			if mediaPartTypes[p.Type] {
				mp := mediaPart{}
				if p.UUID != nil {
					mp.uuid = *p.UUID
				}
				out = append(out, mp)
			}
		}
	}
	return out
}

// withoutMedia returns messages with their multimodal content parts left
// out (a message left with no parts gets an empty text part).
func withoutMedia(messages json.RawMessage) (json.RawMessage, error) {
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(messages, &msgs); err != nil {
		return nil, err
	}
	for _, m := range msgs {
		var parts []json.RawMessage
		if json.Unmarshal(m["content"], &parts) != nil {
			continue
		}
		kept := parts[:0]
		for _, p := range parts {
			var head struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(p, &head) == nil && mediaPartTypes[head.Type] {
				continue
			}
			kept = append(kept, p)
		}
		if len(kept) == 0 {
			kept = append(kept, json.RawMessage(`{"type":"text","text":""}`))
		}
		content, err := json.Marshal(kept)
		if err != nil {
			return nil, err
		}
		m["content"] = content
	}
	return json.Marshal(msgs)
}

// mediaRenderReply is the part of vLLM's chat render answer (a
// GenerateRequest) the gateway reads for a chat with media: the token ids
// and every item's hash and placeholder range.
type mediaRenderReply struct {
	TokenIDs []uint32 `json:"token_ids"`
	Features *struct {
		MMHashes       map[string][]string `json:"mm_hashes"`
		MMPlaceholders map[string][]struct {
			Offset int `json:"offset"`
			Length int `json:"length"`
		} `json:"mm_placeholders"`
	} `json:"features"`
}

// tokenizeMedia returns the token ids of a chat with media parts and the
// items the router hashes with them: from the engine's render endpoint
// when it has one, else from /tokenize (the first item's position only).
func (g *Gateway) tokenizeMedia(ctx context.Context, root string, cr *clientRequest, parts []mediaPart) (*tokenizeReply, error) {
	// The same per-engine probe as the render path's (render.go): one
	// failed probe marks the engine render-less for every request.
	p := g.renders.get(root)
	if now := time.Now(); p.use(now) {
		tr, err := g.renderMedia(ctx, root, cr, parts)
		p.done(err, now)
		if !errors.Is(err, errNoRender) {
			return tr, err
		}
	}
	tr, err := g.tokenizeFallback(ctx, root, kindChat, cr, false, nil)
	if err != nil || tr.Tokens == nil {
		return tr, err // nil Tokens: a field /tokenize lacks, the prompt is unknown
	}
	stripped, err := withoutMedia(cr.Messages)
	if err != nil {
		return nil, fmt.Errorf("leaving out the media parts: %w", err)
	}
	plain := *cr
	plain.Messages = stripped
	tp, err := g.tokenizeCall(ctx, root, kindChat, &plain)
	if err != nil {
		return nil, err
	}
	if first := commonPrefix(tr.Tokens, tp.Tokens); first < len(tr.Tokens) {
		tr.Media = []kvevents.MediaItem{{Offset: first, Length: 1}} // identifier unknown: hashes stop here
	}
	return tr, nil
}

func commonPrefix(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// renderMedia asks the engine's render endpoint for the chat's token ids and
// its items (errNoRender when the engine has none). Items are taken in the
// engine's placeholder order; an item without a hash takes the client's
// uuid for its part, else stays unknown.
func (g *Gateway) renderMedia(ctx context.Context, root string, cr *clientRequest, parts []mediaPart) (*tokenizeReply, error) {
	data, err := g.postRender(ctx, root, renderPath(kindChat), cr.body)
	if err != nil {
		return nil, err
	}
	var rr mediaRenderReply
	if err := json.Unmarshal(data, &rr); err != nil {
		return nil, fmt.Errorf("render at %s: decoding the reply: %w", root, err)
	}
	tr := &tokenizeReply{Count: len(rr.TokenIDs), Tokens: rr.TokenIDs}
	if rr.Features != nil && len(rr.TokenIDs) > 0 {
		tr.Media = safeItems(renderedItems(rr.Features.MMHashes, rr.Features.MMPlaceholders, parts), len(rr.TokenIDs))
	}
	return tr, nil
}

// renderedItems merges the modalities of a render answer into one list in
// placeholder order, each with the engine's hash, or the uuid of the
// client's part of the same rank when the engine gives no hash.
func renderedItems(hashes map[string][]string, places map[string][]struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}, parts []mediaPart) []kvevents.MediaItem {
	var items []kvevents.MediaItem
	for modality, ps := range places {
		for i, p := range ps {
			it := kvevents.MediaItem{Offset: p.Offset, Length: p.Length}
			if hs := hashes[modality]; i < len(hs) {
				it.ID = hs[i]
			}
			items = append(items, it)
		}
	}
	sortItems(items)
	for i := range items {
		if items[i].ID == "" && i < len(parts) {
			items[i].ID = parts[i].uuid
		}
	}
	return items
}

// safeItems returns items when they are what the router accepts for a
// prompt of n tokens (sorted, disjoint, inside it); otherwise one item of
// unknown identifier at the first position any of them names, so that the
// route stops there rather than be refused or claim more.
func safeItems(items []kvevents.MediaItem, n int) []kvevents.MediaItem {
	end, first := 0, n
	ok := true
	for _, it := range items {
		if it.Length < 1 || it.Offset < end || it.Offset+it.Length > n {
			ok = false
		}
		end = it.Offset + it.Length
		first = min(first, max(it.Offset, 0))
	}
	if ok {
		return items
	}
	if first >= n {
		first = 0
	}
	return []kvevents.MediaItem{{Offset: first, Length: 1}}
}

// sortItems orders items by offset (a handful: insertion sort).
func sortItems(items []kvevents.MediaItem) {
	for i := 1; i < len(items); i++ {
		for j := i; j > 0 && items[j].Offset < items[j-1].Offset; j-- {
			items[j], items[j-1] = items[j-1], items[j]
		}
	}
}

// mediaPartsOf returns the multimodal parts of a chat request (nil for
// completions and chats without any).
func mediaPartsOf(kind string, cr *clientRequest) []mediaPart {
	if kind != kindChat {
		return nil
	}
	return chatMediaParts(cr.Messages)
}
