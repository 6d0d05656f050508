package index

// engMap maps a worker's engine block hashes to sequence hashes. It is a
// flat open-addressing table (linear probing, backward-shift deletion)
// rather than a Go map so that the write path can touch the buckets of a
// whole event before working on them: those loads are independent, so
// their cache misses overlap instead of queueing one by one. Owned by one
// worker and used under its mutex only.
//
// In identity mode (ident, used by the workers of an Approx, whose
// "engine hash" is the sequence hash) every key maps to itself: get, del,
// delH and each report the key as the value, and the stored value word
// belongs to the owner (word, put, insertProbed, or the bucket probe
// returns), except that its upper 32 bits must hold the low 32 bits of
// mix(key) (see home). One table then serves both the index and the
// Approx's expiry records. The event path never sees such a table.
type engMap struct {
	s       []uint64 // s[2i] key, s[2i+1] value (the owner's word in identity mode)
	mask    uint64
	n       int  // entries, including the zero key
	hasZero bool // key 0 is kept aside: 0 marks an empty bucket
	ident   bool
	zeroVal uint64
}

const engMinCap = 8

func (m *engMap) len() int { return m.n }

// init empties m and sizes it for capacity entries.
func (m *engMap) init(capacity int) {
	c := engMinCap
	for c*3 < capacity*4 {
		c <<= 1
	}
	*m = engMap{s: make([]uint64, 2*c), mask: uint64(c - 1), ident: m.ident}
}

// touch loads the bucket for hash h (mix of the key) and returns a word
// of it; the caller folds the results into a sink so the loads stay.
func (m *engMap) touch(h uint64) uint64 {
	if m.s == nil {
		return 0
	}
	return m.s[2*(h&m.mask)]
}

// find returns the bucket holding k (found) or the empty bucket an insert
// of k must use, growing the table first if that insert would pass the
// load limit. k must not be 0; h is mix(k).
func (m *engMap) find(k, h uint64) (uint64, bool) {
	if m.s == nil {
		m.s, m.mask = make([]uint64, 2*engMinCap), engMinCap-1
	}
	for {
		i := h & m.mask
		for {
			key := m.s[2*i]
			if key == k {
				return i, true
			}
			if key == 0 {
				break
			}
			i = (i + 1) & m.mask
		}
		if (m.n+1)*4 <= int(m.mask+1)*3 {
			return i, false
		}
		m.rehash(int(m.mask+1) * 2)
	}
}

// insertAt fills the empty bucket i returned by find.
func (m *engMap) insertAt(i, k, v uint64) {
	m.s[2*i], m.s[2*i+1] = k, v
	m.n++
}

func (m *engMap) get(k uint64) (uint64, bool) {
	if k == 0 {
		if !m.hasZero {
			return 0, false
		}
		if m.ident {
			return 0, true
		}
		return m.zeroVal, true
	}
	if m.s == nil {
		return 0, false
	}
	i := mix(k) & m.mask
	for {
		key := m.s[2*i]
		if key == k {
			if m.ident {
				return k, true
			}
			return m.s[2*i+1], true
		}
		if key == 0 {
			return 0, false
		}
		i = (i + 1) & m.mask
	}
}

// put sets k to v.
func (m *engMap) put(k, v uint64) {
	if k == 0 {
		if !m.hasZero {
			m.n++
		}
		m.hasZero, m.zeroVal = true, v
		return
	}
	if m.s == nil {
		m.s, m.mask = make([]uint64, 2*engMinCap), engMinCap-1
	}
	if (m.n+1)*4 > int(m.mask+1)*3 {
		m.rehash(int(m.mask+1) * 2)
	}
	i := mix(k) & m.mask
	for {
		key := m.s[2*i]
		if key == k {
			m.s[2*i+1] = v
			return
		}
		if key == 0 {
			m.s[2*i], m.s[2*i+1] = k, v
			m.n++
			return
		}
		i = (i + 1) & m.mask
	}
}

// del removes k and returns its value.
func (m *engMap) del(k uint64) (uint64, bool) { return m.delH(k, mix(k)) }

// delH is del with h = mix(k) already computed.
func (m *engMap) delH(k, h uint64) (uint64, bool) {
	if k == 0 {
		if !m.hasZero {
			return 0, false
		}
		m.hasZero = false
		m.n--
		if m.ident {
			return 0, true
		}
		return m.zeroVal, true
	}
	if m.s == nil {
		return 0, false
	}
	i := h & m.mask
	for {
		key := m.s[2*i]
		if key == 0 {
			return 0, false
		}
		if key == k {
			break
		}
		i = (i + 1) & m.mask
	}
	v := m.s[2*i+1]
	if m.ident {
		v = k
	}
	m.deleteAt(i)
	return v, true
}

// deleteAt removes the entry in bucket i (backward-shift deletion) and
// shrinks a table grown sparse; bucket numbers are void afterwards.
func (m *engMap) deleteAt(i uint64) {
	j := i
	for {
		j = (j + 1) & m.mask
		kj := m.s[2*j]
		if kj == 0 {
			break
		}
		ideal := m.homeOf(j) & m.mask
		if i <= j {
			if i < ideal && ideal <= j {
				continue
			}
		} else if i < ideal || ideal <= j {
			continue
		}
		m.s[2*i], m.s[2*i+1] = kj, m.s[2*j+1]
		i = j
	}
	m.s[2*i], m.s[2*i+1] = 0, 0
	m.n--
	// An identity-mode table keeps more and shrinks later (identKeepCap).
	keep, sparse := engMinCap, 8
	if m.ident {
		keep, sparse = identKeepCap, 32
	}
	if c := int(m.mask + 1); c > keep && m.n*sparse < c {
		m.rehash(c / 2)
	}
}

// homeOf returns the hash that places the key of bucket j: mix(key), or in
// identity mode the copy home keeps.
func (m *engMap) homeOf(j uint64) uint64 {
	if m.ident {
		return m.home(j)
	}
	return mix(m.s[2*j])
}

func (m *engMap) rehash(c int) {
	old := m.s
	m.s = make([]uint64, 2*c)
	m.mask = uint64(c - 1)
	for i := 0; i < len(old); i += 2 {
		if k := old[i]; k != 0 {
			h := old[i+1] >> 32 // identity mode keeps it there
			if !m.ident {
				h = mix(k)
			}
			j := h & m.mask
			for m.s[2*j] != 0 {
				j = (j + 1) & m.mask
			}
			m.s[2*j], m.s[2*j+1] = k, old[i+1]
		}
	}
}

// each calls fn for every entry.
func (m *engMap) each(fn func(k, v uint64)) {
	if m.ident {
		if m.hasZero {
			fn(0, 0)
		}
		for i := 0; i < len(m.s); i += 2 {
			if k := m.s[i]; k != 0 {
				fn(k, k)
			}
		}
		return
	}
	if m.hasZero {
		fn(0, m.zeroVal)
	}
	for i := 0; i < len(m.s); i += 2 {
		if k := m.s[i]; k != 0 {
			fn(k, m.s[i+1])
		}
	}
}

// bytes is the memory held by the table.
func (m *engMap) bytes() int { return 8 * cap(m.s) }

// Identity mode (Approx) ----------------------------------------------------

// word returns the value word of k (h = mix(k)) without ever growing the
// table.
func (m *engMap) word(k, h uint64) (uint64, bool) {
	_, v, ok := m.probeWord(k, h)
	return v, ok
}

// probeWord is word that also returns the bucket probe returned, for an
// insertProbed after a miss (for k = 0, which lives aside, at is 0: use put).
func (m *engMap) probeWord(k, h uint64) (at, word uint64, found bool) {
	if k == 0 {
		return 0, m.zeroVal, m.hasZero
	}
	if at, found = m.probe(k, h); found {
		word = m.s[2*at+1]
	}
	return at, word, found
}

// probe returns the bucket holding k (k != 0, h = mix(k)), or the empty
// bucket where it would go (found = false; see insertProbed). Unlike find
// it never grows the table.
func (m *engMap) probe(k, h uint64) (i uint64, found bool) {
	if m.s == nil {
		return 0, false
	}
	i = h & m.mask
	for {
		key := m.s[2*i]
		if key == k {
			return i, true
		}
		if key == 0 {
			return i, false
		}
		i = (i + 1) & m.mask
	}
}

// insertProbed stores k (absent, k != 0, h = mix(k)) with value word v in
// bucket at, the one probe returned, growing the table first if the
// insert would pass the load limit.
func (m *engMap) insertProbed(at, k, h, v uint64) {
	if m.s == nil || (m.n+1)*4 > int(m.mask+1)*3 {
		m.rehash(max(int(m.mask+1)*2, engMinCap))
		at, _ = m.probe(k, h)
	}
	m.s[2*at], m.s[2*at+1] = k, v
	m.n++
}

// home returns the hash that places the key of bucket j in identity mode:
// the copy of the low 32 bits of mix(key) kept in the upper half of its
// word, which saves deletions and rehashes the mixing.
func (m *engMap) home(j uint64) uint64 { return m.s[2*j+1] >> 32 }

// identKeepCap is the capacity an identity-mode table keeps however empty
// it gets, and it shrinks only when nearly empty: an Approx worker's
// entries often all expire between two of its routing decisions, and
// shrinking and regrowing the table each time would allocate on every
// Record.
const identKeepCap = 1024
