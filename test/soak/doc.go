// Package soak holds the soak test of issue 16 (soak_test.go): one router
// replica with its HTTP and NATS APIs and a registered worker publishing
// events, driven for a bounded time by good route traffic mixed with bad
// traffic on HTTP, NATS and the event stream (malformed JSON, over-long
// ids, huge bodies, slow clients, forged and garbage events, floods of
// unique hashes, random session ids). It checks that goroutines, RSS and
// the index stay bounded and that good requests keep being served.
//
// It runs 30 s by default; KVR_SOAK_DURATION (a Go duration) runs it
// longer. The limits the replica runs under are in one place, soakBounds
// in soak_test.go, and so are the bounds the test asserts.
//
// It has no non-test code. Start reading at TestSoak.
package soak
