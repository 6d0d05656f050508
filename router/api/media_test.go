package api

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

func TestCheckMedia(t *testing.T) {
	toks := make([]uint32, 10)
	for _, tc := range []struct {
		name  string
		r     RouteRequest
		field string // "" = accepted
	}{
		{"none", RouteRequest{TokenIDs: toks}, ""},
		{"two items", RouteRequest{TokenIDs: toks, Media: []kvevents.MediaItem{{ID: "a", Offset: 0, Length: 3}, {Offset: 3, Length: 7}}}, ""},
		{"without tokens", RouteRequest{BlockHashes: []uint64{1}, Media: []kvevents.MediaItem{{Offset: 0, Length: 1}}}, "media"},
		{"empty item", RouteRequest{TokenIDs: toks, Media: []kvevents.MediaItem{{Offset: 2}}}, "media"},
		{"overlap", RouteRequest{TokenIDs: toks, Media: []kvevents.MediaItem{{Offset: 0, Length: 3}, {Offset: 2, Length: 1}}}, "media"},
		{"unsorted", RouteRequest{TokenIDs: toks, Media: []kvevents.MediaItem{{Offset: 5, Length: 1}, {Offset: 2, Length: 1}}}, "media"},
		{"past the prompt", RouteRequest{TokenIDs: toks, Media: []kvevents.MediaItem{{Offset: 8, Length: 3}}}, "media"},
	} {
		e := tc.r.CheckMedia()
		switch {
		case tc.field == "" && e != nil:
			t.Errorf("%s: refused: %v", tc.name, e)
		case tc.field != "" && (e == nil || e.Field != tc.field):
			t.Errorf("%s: got %v, want a bad_request on %s", tc.name, e, tc.field)
		}
	}
}

// SeqHashes is kvevents' hashing with the request's seed and items.
func TestRouteRequestSeqHashes(t *testing.T) {
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(i)
	}
	items := []kvevents.MediaItem{{ID: "img", Offset: 20, Length: 8}}
	r := RouteRequest{TokenIDs: toks, LoraName: "l", CacheSalt: "s", Media: items}
	want := kvevents.SeqHashesMedia(nil, toks, 16, kvevents.SeedFor("l", "s"), items)
	if got := r.SeqHashes(nil, 16); !slices.Equal(got, want) {
		t.Fatalf("got %x, want %x", got, want)
	}
	plain := RouteRequest{TokenIDs: toks}
	if got, want := plain.SeqHashes(nil, 16), kvevents.SeqHashes(nil, toks, 16, kvevents.HashSeed); !slices.Equal(got, want) {
		t.Fatalf("plain: got %x, want %x", got, want)
	}
}

// A route request that does not fit under the server's max_payload is sent
// as block hashes (the replica's own hashes, with the prompt length) when
// it gives a block size, and refused with payload_too_large (413) when it
// gives none or does not fit even so.
func TestFitRoute(t *testing.T) {
	toks := make([]uint32, 4000)
	for i := range toks {
		toks[i] = uint32(100000 + i)
	}
	req := &RouteRequest{Model: "m", TokenIDs: toks, BlockSize: 16, SessionID: "s",
		Media: []kvevents.MediaItem{{ID: "img", Offset: 100, Length: 64}, {Offset: 3000, Length: 64}}}
	full := AppendRouteRequest(nil, req)
	if got, err := fitRoute(full, req, len(full)); err != nil || len(got) != len(full) {
		t.Fatalf("a request that fits: %d bytes, %v", len(got), err)
	}
	got, err := fitRoute(slices.Clone(full), req, len(full)-1)
	if err != nil {
		t.Fatal(err)
	}
	var dec RouteRequest
	if err := DecodeRouteRequest(got, &dec); err != nil {
		t.Fatal(err)
	}
	want := req.SeqHashes(nil, 16)
	if len(dec.TokenIDs) != 0 || len(dec.Media) != 0 || dec.InputTokens != len(toks) || dec.BlockSize != 16 || dec.SessionID != "s" ||
		len(dec.BlockHashes) != len(want) || len(want) != 3000/16 {
		t.Fatalf("hash form: %d tokens, %d items, input %d, bs %d, %d hashes (want %d)",
			len(dec.TokenIDs), len(dec.Media), dec.InputTokens, dec.BlockSize, len(dec.BlockHashes), len(want))
	}
	for i, h := range want {
		if dec.BlockHashes[i] != uint64(h) {
			t.Fatalf("hash %d differs", i)
		}
	}
	if len(got)*4 > len(full) {
		t.Errorf("the hash form is %d bytes, the token form %d", len(got), len(full))
	}
	for _, tc := range []struct {
		name  string
		req   *RouteRequest
		limit int
	}{{"no block size", &RouteRequest{Model: "m", TokenIDs: toks}, 100}, {"too long even as hashes", req, 100}} {
		body := AppendRouteRequest(nil, tc.req)
		_, err := fitRoute(body, tc.req, tc.limit)
		var ae *Error
		if !errors.As(err, &ae) || !errors.Is(err, ErrPayloadTooLarge) || ae.Status != http.StatusRequestEntityTooLarge || !strings.Contains(ae.Message, "max_payload") {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// The limit MaxPromptTokens states is one that fits: a prompt of that many
// tokens, with long session, request and model names, goes as block hashes
// under the body limit of the shipped NATS configuration (1 MiB).
func TestMaxPromptTokensFits(t *testing.T) {
	limit := 1<<20 - routeHeadroom
	n := MaxPromptTokens(limit, 16)
	if n < 700_000 {
		t.Fatalf("max prompt %d tokens at 1 MiB", n)
	}
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i*2654435761) % 150_000
	}
	long := strings.Repeat("x", 256)
	req := &RouteRequest{V: 1, Model: long, RequestID: long, SessionID: long, SessionMode: "soft", TokenIDs: toks, BlockSize: 16,
		ExpectedOutputTokens: 1 << 20, Priority: -1000, DeadlineMS: 100000}
	if _, err := fitRoute(AppendRouteRequest(nil, req), req, limit); err != nil {
		t.Fatal(err)
	}
	if MaxPromptTokens(limit, 0) != 0 || MaxPromptTokens(1<<30, 16) != MaxTokens {
		t.Fatal("bounds")
	}
}
