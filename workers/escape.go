package workers

import "strings"

// escapeToken turns an arbitrary name (a worker id, a model name) into a
// string that is both a valid JetStream KV key and a single NATS subject
// token. Bytes in [A-Za-z0-9_-] are kept; every other byte, including '.',
// '/', '=' and any non-ASCII byte, becomes "=XX" (upper-case hex). The
// mapping is injective, so two different ids never share a key, and it
// leaves typical ids ("worker-0", "llama_8b") readable. The empty string
// maps to "=" which no non-empty name produces.
//
// kvevents.SubjectToken did not exist when this package was written; the
// load subject uses this function. If kvevents settles on another scheme,
// the lead should switch both to one function so that the events and load
// subjects of a worker carry the same token.
func escapeToken(s string) string {
	if s == "" {
		return "="
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plainByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0x0f])
	}
	return b.String()
}

// unescapeToken reverses escapeToken. It reports false for a string that
// escapeToken cannot have produced.
func unescapeToken(t string) (string, bool) {
	if t == "=" {
		return "", true
	}
	if !strings.Contains(t, "=") {
		for i := 0; i < len(t); i++ {
			if !plainByte(t[i]) {
				return "", false
			}
		}
		return t, t != ""
	}
	var b strings.Builder
	b.Grow(len(t))
	for i := 0; i < len(t); i++ {
		c := t[i]
		if c != '=' {
			if !plainByte(c) {
				return "", false
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(t) {
			return "", false
		}
		hi, ok1 := unhex(t[i+1])
		lo, ok2 := unhex(t[i+2])
		if !ok1 || !ok2 {
			return "", false
		}
		v := hi<<4 | lo
		if plainByte(v) { // escapeToken never escapes a plain byte
			return "", false
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), true
}

func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
