// Package session is the one vocabulary for a session's mode: Mode (Hard or
// Soft, Unset when a request or configuration leaves it to the default), its
// one parser (ParseMode), its one printed form (String: "hard" or "soft",
// also the wire and stored spelling) and its one ordering.
//
// It is a leaf: it imports nothing of kvrouter, so the bindings table (which
// stores a binding's mode), the scheduler (whose affinity requirement has
// the binding's mode as its strength), the route API's callers and the host
// share one type without importing each other. It does not own what a mode
// does: the commit rule is bindings', the pin rule router/scheduler's.
//
// Start reading at Mode in mode.go.
package session
