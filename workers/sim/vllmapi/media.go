package vllmapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/kvrouter/kvrouter/kvevents"
)

// Images in chat requests, as vLLM takes them: a content part
//
//	{"type": "image_url", "image_url": {"url": "https://... or data:image/png;base64,..."}, "uuid": "optional"}
//
// renders, where it stands among the message's parts, as one image
// placeholder (imageMarker), which the processor then expands into
// Config.ImageTokens copies of ImageToken; the item's identifier is its
// uuid when the client gave one (vLLM then uses the uuid string as the
// item's hash), otherwise a content hash (imageIdentifier). The engine
// keys the blocks the placeholders overlap with (identifier, offset) pairs
// and publishes them in extra_keys (sim.Request.Media).

// DefaultImageTokens is the number of placeholder tokens an image expands
// to when Config.ImageTokens is 0 (a fixed count: the simulator does not
// decode images, and real models' counts depend on the image's size).
const DefaultImageTokens = 64

// ImageToken is the placeholder token id an image expands to: Qwen2-VL's
// <|image_pad|>, outside the byte vocabulary, so no text renders to it.
const ImageToken uint32 = 151655

// imageMarker is the placeholder text an image part renders to before the
// processor expands it. A text part that contains it counts as an image
// placeholder too, and the request is refused when the counts differ, as
// vLLM refuses a prompt whose placeholders do not match its items.
const imageMarker = "<|image_pad|>"

// contentPart is one part of a message's content list, as far as the
// simulator reads it.
type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
	UUID *string `json:"uuid"`
}

// partText is the text a content part renders to: its text, an image's
// placeholder, or nothing (ok false) for parts the simulator ignores.
func partText(p contentPart) (string, bool) {
	switch p.Type {
	case "text":
		return p.Text, true
	case "image_url":
		return imageMarker, true
	}
	return "", false
}

// image is one image part of a chat request: the identifier vLLM hashes
// it under.
type image struct {
	id string
}

// chatImages returns the image parts of msgs in prompt order (messages in
// order, parts in order), each with its identifier. An image part without
// a url or uuid is refused.
func chatImages(model string, msgs []chatMessage) ([]image, error) {
	var out []image
	for i, m := range msgs {
		raw := bytes.TrimSpace(m.Content)
		if len(raw) == 0 || raw[0] != '[' {
			continue
		}
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			continue // messageContent reports it
		}
		for j, p := range parts {
			if p.Type != "image_url" {
				continue
			}
			id, err := imageIdentifier(model, p)
			if err != nil {
				return nil, fmt.Errorf("messages[%d].content[%d]: %w", i, j, err)
			}
			out = append(out, image{id: id})
		}
	}
	return out, nil
}

// imageIdentifier is the identifier of an image part: its uuid when given
// (vLLM uses the uuid string itself as the item's hash when no processor
// kwargs apply), else the hex SHA-256 of the model name and the url (a
// data: URL carries the image's bytes). vLLM hashes the decoded pixels
// with BLAKE3 instead; the simulator decodes nothing, so the same picture
// under two URLs is two items here.
func imageIdentifier(model string, p contentPart) (string, error) {
	if p.UUID != nil && *p.UUID != "" {
		return *p.UUID, nil
	}
	if p.ImageURL == nil || p.ImageURL.URL == "" {
		return "", fmt.Errorf("image_url part without a url or uuid")
	}
	h := sha256.New()
	h.Write([]byte(model))
	h.Write([]byte{0})
	h.Write([]byte(p.ImageURL.URL))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// expandImages replaces every image placeholder in tokens (a rendered
// chat) with n copies of ImageToken and returns the new tokens and the
// images' items: their placeholder ranges, with their identifiers. The
// placeholders must be exactly as many as images.
func expandImages(tokens []uint32, images []image, n int) ([]uint32, []kvevents.MediaItem, error) {
	marker := Tokenize(imageMarker)
	count := 0
	for i := 0; i+len(marker) <= len(tokens); i++ {
		if equalTokens(tokens[i:i+len(marker)], marker) {
			count++
			i += len(marker) - 1
		}
	}
	if count != len(images) {
		return nil, nil, fmt.Errorf("found %d image placeholders (%s) in the rendered prompt for %d images", count, imageMarker, len(images))
	}
	if count == 0 {
		return tokens, nil, nil
	}
	out := make([]uint32, 0, len(tokens)+count*(n-len(marker)))
	items := make([]kvevents.MediaItem, 0, count)
	for i := 0; i < len(tokens); {
		if i+len(marker) <= len(tokens) && equalTokens(tokens[i:i+len(marker)], marker) {
			items = append(items, kvevents.MediaItem{ID: images[len(items)].id, Offset: len(out), Length: n})
			for range n {
				out = append(out, ImageToken)
			}
			i += len(marker)
			continue
		}
		out = append(out, tokens[i])
		i++
	}
	return out, items, nil
}

func equalTokens(a, b []uint32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

// chatMedia expands the images of a rendered chat (tokens, from msgs):
// the tokens the engine computes and the items it hashes with them.
func (s *Server) chatMedia(tokens []uint32, msgs []chatMessage) ([]uint32, []kvevents.MediaItem, *Error) {
	images, err := chatImages(s.cfg.Model, msgs)
	if err != nil {
		return nil, nil, badRequest("%v", err)
	}
	tokens, items, err := expandImages(tokens, images, s.cfg.ImageTokens)
	if err != nil {
		return nil, nil, badRequest("%v", err)
	}
	return tokens, items, nil
}

// Features are the multimodal part of a rendered request, in the shape of
// vLLM's render endpoints (POST /v1/chat/completions/render, the
// GenerateRequest's "features"): per modality, the items' hashes (the
// identifiers the engine puts in extra_keys) and placeholder ranges, in
// prompt order. Nil when the prompt has no items.
type Features struct {
	MMHashes       map[string][]string           `json:"mm_hashes"`
	MMPlaceholders map[string][]PlaceholderRange `json:"mm_placeholders"`
}

// PlaceholderRange is one item's placeholder tokens.
type PlaceholderRange struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}

// featuresOf returns the features of a prompt's image items (nil without
// items): what a render endpoint answers in "features".
func featuresOf(items []kvevents.MediaItem) *Features {
	if len(items) == 0 {
		return nil
	}
	f := &Features{MMHashes: map[string][]string{}, MMPlaceholders: map[string][]PlaceholderRange{}}
	for _, it := range items {
		f.MMHashes["image"] = append(f.MMHashes["image"], it.ID)
		f.MMPlaceholders["image"] = append(f.MMPlaceholders["image"], PlaceholderRange{Offset: it.Offset, Length: it.Length})
	}
	return f
}

// RenderChat renders a chat completion request body as the engine would
// compute it: its token ids (images expanded) and its multimodal features,
// what vLLM's POST /v1/chat/completions/render answers in "token_ids" and
// "features". It applies the chat endpoint's own rendering and
// validation; an error is the endpoint's error reply.
func (s *Server) RenderChat(body []byte) ([]uint32, *Features, error) {
	var req chatRequest
	if err := decodeBody(body, &req); err != nil {
		return nil, nil, badRequest("%v", err)
	}
	if e := s.checkModel(req.Model); e != nil {
		return nil, nil, e
	}
	tokens, items, e := s.chatPrompt(&req)
	if e != nil {
		return nil, nil, e
	}
	return tokens, featuresOf(items), nil
}
