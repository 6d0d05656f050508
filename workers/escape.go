package workers

import "strings"

// escapeToken turns a worker id into a JetStream KV key (alphabet
// [-/_=.a-zA-Z0-9], no leading or trailing '.'). Bytes in [A-Za-z0-9_-] are
// kept; every other byte, including '.', '/', '=' and any non-ASCII byte,
// becomes "=XX" (upper-case hex). The mapping is injective, so two ids
// never share a key, and typical ids ("worker-0", "llama_8b") stay
// readable. The empty string maps to "=", which no non-empty id produces.
//
// kvevents.SubjectToken (used for the load subject) escapes with '%',
// which is not in the KV key alphabet, hence this second function. Keys are
// single subject tokens too ('.' is escaped), so a key can be watched alone.
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

func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}
