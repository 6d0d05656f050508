package index

import (
	"math/bits"
	"slices"
)

// bigSet is the worker set of a block that does not fit inline in its
// table word (table.go): more than four workers, or four with a slot of
// 32,767 or more.
// It is immutable once published (copy on write): readers use it without
// locks, and a writer replaces it with a new one. It is a sorted list of
// slots while that is smaller than a bitmap over the slots it spans, and a
// bitmap otherwise, so a block shared by 4 of 10,000 workers costs 16 bytes
// of members and one shared by all of them 1,250 bytes.
type bigSet struct {
	key  uint64 // the block's sequence hash: readers check it (see table.go)
	n    int
	list []uint32 // sorted members; nil when bits is used
	bits []uint64 // bitmap over slots; nil when list is used
}

const bigSetHeader = 8 + 8 + 24 + 24 // key, n, two slice headers

func (b *bigSet) bytes() int {
	return bigSetHeader + 4*cap(b.list) + 8*cap(b.bits)
}

// wantBitmap says whether n members spanning words bitmap words are
// smaller as a bitmap; hysteresis keeps a set from flipping on every change.
func wantBitmap(n, words int, isBitmap bool) bool {
	if isBitmap {
		return n >= words // back to a list only when it is half the bitmap
	}
	return n >= 2*words
}

func newBigSet(key uint64, members []uint32) *bigSet {
	l := slices.Clone(members)
	slices.Sort(l)
	b := &bigSet{key: key, n: len(l), list: l}
	if w := int(l[len(l)-1]/64) + 1; wantBitmap(len(l), w, false) {
		return b.toBitmap(w)
	}
	return b
}

func (b *bigSet) toBitmap(words int) *bigSet {
	nb := &bigSet{key: b.key, n: b.n, bits: make([]uint64, words)}
	for _, s := range b.list {
		nb.bits[s/64] |= 1 << (s % 64)
	}
	return nb
}

func (b *bigSet) has(s uint32) bool {
	if b.bits != nil {
		w := int(s / 64)
		return w < len(b.bits) && b.bits[w]&(1<<(s%64)) != 0
	}
	l := b.list
	if len(l) <= 16 {
		for _, x := range l {
			if x == s {
				return true
			}
		}
		return false
	}
	_, ok := slices.BinarySearch(l, s)
	return ok
}

// with returns a copy with s added (s must be absent).
func (b *bigSet) with(s uint32) *bigSet {
	if b.bits != nil {
		w := int(s / 64)
		nw := max(len(b.bits), w+1)
		nb := &bigSet{key: b.key, n: b.n + 1, bits: make([]uint64, nw)}
		copy(nb.bits, b.bits)
		nb.bits[w] |= 1 << (s % 64)
		return nb
	}
	i, _ := slices.BinarySearch(b.list, s)
	l := make([]uint32, len(b.list)+1)
	copy(l, b.list[:i])
	l[i] = s
	copy(l[i+1:], b.list[i:])
	nb := &bigSet{key: b.key, n: len(l), list: l}
	if w := int(l[len(l)-1]/64) + 1; wantBitmap(nb.n, w, false) {
		return nb.toBitmap(w)
	}
	return nb
}

// without returns a copy with s removed (s must be present).
func (b *bigSet) without(s uint32) *bigSet {
	if b.bits != nil {
		nb := &bigSet{key: b.key, n: b.n - 1}
		if wantBitmap(nb.n, len(b.bits), true) {
			nb.bits = slices.Clone(b.bits)
			nb.bits[s/64] &^= 1 << (s % 64)
			return nb
		}
		nb.list = make([]uint32, 0, nb.n)
		for w, word := range b.bits {
			for word != 0 {
				t := uint32(bits.TrailingZeros64(word))
				word &= word - 1
				if x := uint32(w)*64 + t; x != s {
					nb.list = append(nb.list, x)
				}
			}
		}
		return nb
	}
	l := make([]uint32, 0, len(b.list)-1)
	for _, x := range b.list {
		if x != s {
			l = append(l, x)
		}
	}
	return &bigSet{key: b.key, n: len(l), list: l}
}

// appendSlots appends the members in increasing order.
func (b *bigSet) appendSlots(dst []uint32) []uint32 {
	if b.bits == nil {
		return append(dst, b.list...)
	}
	for w, word := range b.bits {
		for word != 0 {
			t := uint32(bits.TrailingZeros64(word))
			word &= word - 1
			dst = append(dst, uint32(w)*64+t)
		}
	}
	return dst
}
