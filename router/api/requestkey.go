package api

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"unsafe"
)

// Request keys: how a client proves it owns a request id before any route
// reply (and its fence) reached it, to cancel a request still queued.
//
// A client that chooses its request id draws a key (RequestKeyBytes random
// bytes, hex) and makes the id end with the key's digest: the first 16
// bytes of SHA-256 of the key, hex (NewRequestID). It keeps the key to
// itself and presents it as the fence of a cancel. The replica stores
// nothing: it hashes the presented key and compares with the id's tail. The
// id is public (booking sync, logs, traces); the key cannot be recovered
// from it, and an id cannot be made for a key one does not hold.

// RequestKeyBytes is the randomness of a request key (hex encoded, twice as
// many characters); MinRequestKeyLen the shortest key a replica accepts.
const (
	RequestKeyBytes  = 16
	MinRequestKeyLen = 2 * RequestKeyBytes
	requestKeyDigest = 32 // hex characters of the key's digest ending an id
)

// NewRequestID returns a request id made of prefix and the digest of a new
// request key, and the key: give the id as RouteRequest.RequestID, keep the
// key, and present it as the fence of a cancel (Client.Cancel).
func NewRequestID(prefix string) (id, key string) {
	var rnd [RequestKeyBytes]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails
	key = hex.EncodeToString(rnd[:])
	return prefix + requestKeyTail(key), key
}

// RequestKeyMatches reports whether key is the request key id was made
// from (NewRequestID): key is at least MinRequestKeyLen bytes and id ends
// with its digest. Constant time in the digest.
func RequestKeyMatches(id, key string) bool {
	if len(key) < MinRequestKeyLen || len(key) > MaxFenceLen || len(id) < requestKeyDigest {
		return false
	}
	sum := sha256.Sum256(stringBytes(key))
	var tail [requestKeyDigest]byte
	hex.Encode(tail[:], sum[:requestKeyDigest/2])
	return subtle.ConstantTimeCompare(tail[:], stringBytes(id[len(id)-requestKeyDigest:])) == 1
}

// stringBytes views s as bytes for a reader that does not keep or modify
// them, without copying.
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

func requestKeyTail(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:requestKeyDigest/2])
}
