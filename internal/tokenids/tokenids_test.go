package tokenids

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []uint32
		n    int // bytes read; -1 = refused
	}{
		{`[1,2,3]`, []uint32{1, 2, 3}, 7},
		{" \n[ 0 , 4294967295 ]x", []uint32{0, 4294967295}, 20},
		{`[]`, nil, 2},
		{`[4294967296]`, nil, -1},
		{`[01]`, nil, -1},
		{`[-1]`, nil, -1},
		{`[1.5]`, nil, -1},
		{`[1e3]`, nil, -1},
		{`[1,]`, nil, -1},
		{`["1"]`, nil, -1},
		{`[1`, nil, -1},
		{`{}`, nil, -1},
		{``, nil, -1},
	} {
		got, n, err := Parse([]byte(c.in), nil)
		if c.n < 0 {
			if err == nil {
				t.Errorf("%q: read %v, want an error", c.in, got)
			}
			continue
		}
		if err != nil || n != c.n || !slices.Equal(got, c.want) {
			t.Errorf("%q: %v %d %v, want %v %d", c.in, got, n, err, c.want, c.n)
		}
	}
}

// Parse reads a whole array exactly as encoding/json reads it into a
// []uint32, and refuses what it refuses.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, `[ 4294967295 , 0 ]`, `[4294967296]`, `[01]`, `[0]`, `[]`, `[-1]`, `[1.0]`, `["1"]`, `[1,]`, `[[1]]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, n, err := Parse(data, nil)
		whole := err == nil && len(bytes.TrimLeft(data[n:], " \t\n\r")) == 0
		var want []uint32
		jerr := json.Unmarshal(data, &want)
		switch {
		case whole && jerr != nil:
			t.Fatalf("%q: read %v, encoding/json: %v", data, got, jerr)
		case jerr == nil && want != nil && !whole:
			t.Fatalf("%q: refused (%v, %d of %d bytes), encoding/json reads %v", data, err, n, len(data), want)
		case whole && jerr == nil && !slices.Equal(got, want):
			t.Fatalf("%q: %v, encoding/json %v", data, got, want)
		}
	})
}

// Capacity bounds the ids: commas plus one, at most the limit.
func TestCapacity(t *testing.T) {
	if c := Capacity([]byte(`[1,2,3]`), 100); c != 3 {
		t.Fatalf("capacity %d, want 3", c)
	}
	if c := Capacity([]byte(`[1,2,3]`), 2); c != 2 {
		t.Fatalf("capacity %d, want the limit 2", c)
	}
}
