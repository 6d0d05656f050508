package workers

import "github.com/kvrouter/kvrouter/internal/escape"

// keyTokens turns a worker id into a JetStream KV key (alphabet
// [-/_=.a-zA-Z0-9], no leading or trailing '.'): internal/escape's scheme
// with '=' as the escape byte. Bytes in [A-Za-z0-9_-] are kept; every other
// byte, including '.', '/', '=' and any non-ASCII byte, becomes "=XX"
// (upper-case hex). The mapping is injective, so two ids never share a key,
// and typical ids ("worker-0", "llama_8b") stay readable. The empty string
// maps to "=", which no non-empty id produces. Read-only after package init.
//
// kvevents.SubjectToken (used for the load subject) escapes with '%', which
// is not in the KV key alphabet, hence a second scheme. Keys are single
// subject tokens too ('.' is escaped), so a key can be watched alone.
var keyTokens = escape.New('=', plainByte)

func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}
