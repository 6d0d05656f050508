// Package jsonscan walks the members of a JSON object without decoding
// them: each member's key and the raw bytes of its value, the whole text
// validated as encoding/json validates it. The gateway reads its routing
// fields this way (gateway/request.go): encoding/json into a struct of
// json.RawMessage fields scans a body twice and copies every raw value, a
// millisecond of CPU for a 70 KB prompt of token ids, several times what
// the gateway then does with it.
//
// It owns the syntax only. A body it does not take (not an object, a key
// with escapes, nesting deeper than maxDepth, invalid JSON) is the caller's
// to hand to encoding/json, which then gives the error or the answer: the
// scanner never reports a syntax error of its own.
package jsonscan

// maxDepth bounds nesting: deeper bodies go to encoding/json (whose own
// limit is 10,000) so that the scanner's recursion stays small.
const maxDepth = 512

// Members calls fn with the key (the bytes between its quotes) and the raw
// value of each member of the JSON object that is the whole of data (white
// space around it allowed), in order, duplicates included. It reports
// false, having called fn for some prefix of the members or none, when fn
// returns false, when data is not exactly one valid JSON object, when a key
// has an escape sequence, or when the nesting is deeper than maxDepth.
// Value slices share data's memory, with their capacity cut at their end.
func Members(data []byte, fn func(key, value []byte) bool) bool {
	s := scanner{data: data}
	i := s.ws(0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	end := s.object(i, 1, fn)
	return end >= 0 && s.ws(end) == len(data)
}

type scanner struct{ data []byte }

// ws returns the index of the first byte at or after i that is not JSON
// white space.
func (s *scanner) ws(i int) int {
	for i < len(s.data) {
		switch s.data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value returns the end of the JSON value starting at i, or -1.
func (s *scanner) value(i, depth int) int {
	if i >= len(s.data) {
		return -1
	}
	switch c := s.data[i]; {
	case c == '"':
		end, _ := s.str(i)
		return end
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number(i)
	case c == '[':
		return s.array(i, depth+1)
	case c == '{':
		return s.object(i, depth+1, nil)
	case c == 't':
		return s.literal(i, "true")
	case c == 'f':
		return s.literal(i, "false")
	case c == 'n':
		return s.literal(i, "null")
	}
	return -1
}

func (s *scanner) literal(i int, lit string) int {
	if len(s.data)-i < len(lit) || string(s.data[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// str returns the end (past the closing quote) of the string starting at
// the quote at i, or -1, and whether it has no escape sequence.
func (s *scanner) str(i int) (int, bool) {
	d := s.data
	plain := true
	for i++; i < len(d); i++ {
		switch c := d[i]; {
		case c == '"':
			return i + 1, plain
		case c < 0x20:
			return -1, false
		case c == '\\':
			plain = false
			i++
			if i >= len(d) {
				return -1, false
			}
			switch d[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(d)-i < 5 || !hex(d[i+1]) || !hex(d[i+2]) || !hex(d[i+3]) || !hex(d[i+4]) {
					return -1, false
				}
				i += 4
			default:
				return -1, false
			}
		}
	}
	return -1, false
}

func hex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// number returns the end of the number starting at i, or -1: JSON's
// grammar, -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (s *scanner) number(i int) int {
	d := s.data
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		i = s.digits(i + 1)
	default:
		return -1
	}
	if i < len(d) && d[i] == '.' {
		j := s.digits(i + 1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := s.digits(i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func (s *scanner) digits(i int) int {
	for i < len(s.data) && s.data[i] >= '0' && s.data[i] <= '9' {
		i++
	}
	return i
}

func (s *scanner) array(i, depth int) int {
	if depth > maxDepth {
		return -1
	}
	i = s.ws(i + 1)
	if i < len(s.data) && s.data[i] == ']' {
		return i + 1
	}
	for more := true; more; {
		if i = s.value(i, depth); i < 0 {
			return -1
		}
		if i, more = s.sep(i, ']'); i < 0 {
			return -1
		}
	}
	return i
}

// object returns the end of the object starting at i, or -1. With fn, it
// calls fn for each member and also gives up (-1) on a key with escapes
// or when fn returns false (Members).
func (s *scanner) object(i, depth int, fn func(key, value []byte) bool) int {
	if depth > maxDepth {
		return -1
	}
	i = s.ws(i + 1)
	if i < len(s.data) && s.data[i] == '}' {
		return i + 1
	}
	for more := true; more; {
		if i >= len(s.data) || s.data[i] != '"' {
			return -1
		}
		kEnd, plain := s.str(i)
		if kEnd < 0 || (fn != nil && !plain) {
			return -1
		}
		key := s.data[i+1 : kEnd-1]
		i = s.ws(kEnd)
		if i >= len(s.data) || s.data[i] != ':' {
			return -1
		}
		v := s.ws(i + 1)
		if i = s.value(v, depth); i < 0 {
			return -1
		}
		if fn != nil && !fn(key, s.data[v:i:i]) {
			return -1
		}
		if i, more = s.sep(i, '}'); i < 0 {
			return -1
		}
	}
	return i
}

// sep reads what follows a member or element at i: past a comma and white
// space, with more; past the closing byte, without; or -1.
func (s *scanner) sep(i int, closing byte) (int, bool) {
	i = s.ws(i)
	switch {
	case i >= len(s.data):
		return -1, false
	case s.data[i] == ',':
		return s.ws(i + 1), true
	case s.data[i] == closing:
		return i + 1, false
	}
	return -1, false
}
