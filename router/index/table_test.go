package index

import (
	"slices"
	"testing"
)

// TestInlineForms walks one block's set through every form of its table
// word, adding and removing members, and checks the form and the members
// at each step: wide inline up to three workers, narrow inline at four
// when every slot fits 15 bits, a big set otherwise, and back.
func TestInlineForms(t *testing.T) {
	const (
		wide = iota
		narrow
		big
	)
	formOf := func(v uint64) int {
		switch {
		case v&bigFlag != 0:
			return big
		case v&narrowFlag != 0:
			return narrow
		}
		return wide
	}
	const key = 42
	h := mix(key)
	var sh shard
	sh.init()
	for _, c := range []struct {
		name    string
		add     bool
		slot    uint32
		changed bool
		form    int
		want    []uint32
	}{
		{"first", true, 7, true, wide, []uint32{7}},
		{"second", true, 0, true, wide, []uint32{0, 7}},
		{"third", true, 32766, true, wide, []uint32{0, 7, 32766}},
		{"fourth, every slot under 32,767", true, 3, true, narrow, []uint32{0, 3, 7, 32766}},
		{"again: no change", true, 3, false, narrow, []uint32{0, 3, 7, 32766}},
		{"fifth", true, 9, true, big, []uint32{0, 3, 7, 9, 32766}},
		{"back to four", false, 9, true, narrow, []uint32{0, 3, 7, 32766}},
		{"a member of a narrow set leaves", false, 0, true, wide, []uint32{3, 7, 32766}},
		{"fourth with slot 32,767: too wide", true, 32767, true, big, []uint32{3, 7, 32766, 32767}},
		{"back to three", false, 3, true, wide, []uint32{7, 32766, 32767}},
		{"a large slot and three small ones", true, 1, true, big, []uint32{1, 7, 32766, 32767}},
		{"the large one leaves", false, 32767, true, wide, []uint32{1, 7, 32766}},
		{"absent: no change", false, 5, false, wide, []uint32{1, 7, 32766}},
	} {
		var changed bool
		if c.add {
			changed = sh.add(key, h, c.slot)
		} else {
			changed = sh.remove(key, h, c.slot)
		}
		v, b, ok := sh.get(key, h)
		if !ok {
			t.Fatalf("%s: the block is gone", c.name)
		}
		var got []uint32
		if b != nil {
			got = b.appendSlots(nil)
		} else {
			got = inlineSlots(nil, v)
		}
		slices.Sort(got)
		if changed != c.changed || formOf(v) != c.form || !slices.Equal(got, c.want) {
			t.Fatalf("%s: changed %v, form %d, members %v; want %v, %d, %v", c.name, changed, formOf(v), got, c.changed, c.form, c.want)
		}
		for _, s := range []uint32{0, 1, 3, 5, 7, 9, 32766, 32767} {
			if b == nil && inlineHas(v, s) != slices.Contains(c.want, s) {
				t.Fatalf("%s: inlineHas(%d) = %v", c.name, s, inlineHas(v, s))
			}
		}
	}
	if sh.nbig != 0 {
		t.Fatalf("%d big sets left, want 0 (every big set went back inline)", sh.nbig)
	}
}
