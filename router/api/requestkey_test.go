package api

import (
	"regexp"
	"strings"
	"testing"
)

func TestRequestKey(t *testing.T) {
	id, key := NewRequestID("gw-a-")
	if !regexp.MustCompile(`^gw-a-[0-9a-f]{32}$`).MatchString(id) || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(key) {
		t.Fatalf("NewRequestID = %q, %q; want gw-a-<32 hex digits>, <32 hex digits>", id, key)
	}
	if !RequestKeyMatches(id, key) {
		t.Fatal("an id does not match its own key")
	}
	id2, key2 := NewRequestID("gw-a-")
	if id2 == id || key2 == key {
		t.Fatal("two ids or keys alike")
	}
	for _, c := range []struct{ name, id, key string }{
		{"another key", id, key2},
		{"the id's digest as the key", id, id[len(id)-32:]},
		{"an empty key", id, ""},
		{"an id shorter than a digest", "x", key},
		{"the digest upper-cased", "gw-a-" + strings.ToUpper(id[5:]), key},
		{"a key over MaxFenceLen", strings.Repeat("a", MaxFenceLen+1), strings.Repeat("a", MaxFenceLen+1)},
	} {
		if RequestKeyMatches(c.id, c.key) {
			t.Errorf("%s matches", c.name)
		}
	}
	// A short key is refused even when the id was made from it: its
	// digest would give it away.
	short := "abc"
	if RequestKeyMatches("x-"+requestKeyTail(short), short) {
		t.Error("a key shorter than MinRequestKeyLen matches")
	}
	if n := testing.AllocsPerRun(100, func() { _ = RequestKeyMatches(id, key) }); n != 0 {
		t.Errorf("RequestKeyMatches allocates %v times", n)
	}
}
