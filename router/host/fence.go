package host

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"strconv"
	"sync"
	"unsafe"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
)

// Request ids and booking fences. A generated request id is the replica id
// and 96 random bits, so nobody can guess another caller's id. The fence of
// a booking is a secret only its route reply carries: lifecycle calls must
// present it, so a third party that learns an id (booking sync carries
// them) still cannot free, cancel or mark someone else's request. The
// fence is an HMAC-SHA256 of the booking (request id, worker, rank,
// attempt) under a key the replica draws at New: the replica checks it
// without storing it, and a new attempt of the same id gets a new fence.

// requestIDRandomBytes is the randomness of a generated request id.
const requestIDRandomBytes = 12

// newRequestID returns "<replica>-<24 hex digits>" with one allocation.
func (r *Replica) newRequestID(s *routeScratch) string {
	var rnd [requestIDRandomBytes]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails
	b := append(s.out[:0], r.id...)
	b = append(b, '-')
	b = hex.AppendEncode(b, rnd[:])
	s.out = b
	return string(b)
}

// fenceBytes is the length of a fence before hex encoding (128 bits).
const fenceBytes = 16

// fenceSigner makes and checks fences. Its hashers are pooled (an HMAC
// allocates when built, not when reset).
type fenceSigner struct {
	pool sync.Pool // hash.Hash, keyed
}

func newFenceSigner() *fenceSigner {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return &fenceSigner{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// sum writes the MAC of f into out; each field is length-prefixed so no two
// bookings sign the same bytes.
func (fs *fenceSigner) sum(f scheduler.Fence, out *[sha256.Size]byte) {
	h := fs.pool.Get().(hash.Hash)
	h.Reset()
	var n [8]byte
	for _, s := range [...]string{f.RequestID, f.Worker.Worker} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write(unsafeBytes(s))
	}
	binary.BigEndian.PutUint64(n[:], uint64(f.Worker.Rank))
	h.Write(n[:])
	binary.BigEndian.PutUint64(n[:], f.Attempt)
	h.Write(n[:])
	h.Sum(out[:0])
	fs.pool.Put(h)
}

// token is the fence of booking f as the route reply carries it.
func (fs *fenceSigner) token(f scheduler.Fence) string {
	var mac [sha256.Size]byte
	fs.sum(f, &mac)
	return hex.EncodeToString(mac[:fenceBytes])
}

// valid reports whether token is the fence of booking f (in constant time).
func (fs *fenceSigner) valid(f scheduler.Fence, token string) bool {
	var mac [sha256.Size]byte
	fs.sum(f, &mac)
	var want [2 * fenceBytes]byte
	hex.Encode(want[:], mac[:fenceBytes])
	return subtle.ConstantTimeCompare(want[:], unsafeBytes(token)) == 1
}

// checkFence admits a lifecycle call on booking fe: it must present the
// booking's fence (unless Config.AllowUnfencedLifecycle and it presents
// none) and, when it names an attempt, the booking's. A missing fence is a
// bad_request; a wrong one is a not_found, the answer for an unknown
// request, so fences cannot be probed.
func (r *Replica) checkFence(fe scheduler.Fence, lr *api.LifecycleRequest) *api.Error {
	switch {
	case lr.Fence == "" && !r.cfg.AllowUnfencedLifecycle:
		return api.BadField("fence", "is required: give the fence of request %q's route reply", lr.RequestID)
	case lr.Fence != "" && !r.signer.valid(fe, lr.Fence):
		return api.NewError(api.CodeNotFound, "request "+strconv.Quote(lr.RequestID)+" has no booking with this fence on replica "+r.id, nil).OnField("fence")
	case lr.Attempt != 0 && lr.Attempt != fe.Attempt:
		return api.NewError(api.CodeNotFound, "request "+strconv.Quote(lr.RequestID)+" attempt "+strconv.FormatUint(lr.Attempt, 10)+
			" is not its current booking (attempt "+strconv.FormatUint(fe.Attempt, 10)+")", nil).OnField("attempt")
	}
	return nil
}

// unsafeBytes views s as bytes for a reader that does not keep or modify
// them (a hash), without copying.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
