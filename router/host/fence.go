package host

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"slices"
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
//
// A request still queued has no fence yet. Its owner chose its id with
// api.NewRequestID, which ends the id with the digest of a key only the
// owner holds; a cancel presents that key (api.RequestKeyMatches), before
// or after the route reply. A cancel without either is refused, so ids a
// client makes up grant nothing to whoever guesses them. An operator's
// calls (api.AdminSubject) skip the check: NATS permissions keep everyone
// else off those subjects. Reply subjects are the other half: each client
// reads only its own inbox (deploy/nats), so no client of the same role
// sees another's fences.

// requestIDRandomBytes is the randomness of a generated request id.
const requestIDRandomBytes = 12

// newRequestID returns "<replica>-<24 hex digits>" with one allocation:
// the random bytes are drawn into the scratch buffer, past the digits they
// become.
func (r *Replica) newRequestID(s *routeScratch) string {
	b := append(s.out[:0], r.id...)
	b = append(b, '-')
	n, digits := len(b), 2*requestIDRandomBytes
	b = slices.Grow(b, digits+requestIDRandomBytes)[:n+digits+requestIDRandomBytes]
	rnd := b[n+digits:]
	_, _ = rand.Read(rnd) // crypto/rand.Read never fails
	hex.Encode(b[n:n+digits], rnd)
	s.out = b[:n+digits]
	return string(s.out)
}

// fenceBytes is the length of a fence before hex encoding (128 bits).
const fenceBytes = 16

// fenceSigner makes and checks fences. Its hashers are pooled with the
// buffers they write through (an HMAC allocates when built, not when
// reset; a buffer handed to an interface method would escape).
type fenceSigner struct {
	pool sync.Pool // *fenceHasher
}

type fenceHasher struct {
	h   hash.Hash // HMAC-SHA256 under the replica's key
	n   [8]byte
	mac [sha256.Size]byte
	hex [2 * fenceBytes]byte
}

func newFenceSigner() *fenceSigner {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return &fenceSigner{pool: sync.Pool{New: func() any { return &fenceHasher{h: hmac.New(sha256.New, key)} }}}
}

// sum leaves the fence of f, hex encoded, in fh.hex; each field is
// length-prefixed so no two bookings sign the same bytes.
func (fh *fenceHasher) sum(f scheduler.Fence) {
	fh.h.Reset()
	put := func(v uint64) {
		binary.BigEndian.PutUint64(fh.n[:], v)
		fh.h.Write(fh.n[:])
	}
	put(uint64(len(f.RequestID)))
	fh.h.Write(unsafeBytes(f.RequestID))
	put(uint64(len(f.Worker.Worker)))
	fh.h.Write(unsafeBytes(f.Worker.Worker))
	put(uint64(f.Worker.Rank))
	put(f.Attempt)
	fh.h.Sum(fh.mac[:0])
	hex.Encode(fh.hex[:], fh.mac[:fenceBytes])
}

// token is the fence of booking f as the route reply carries it (one
// allocation: the string).
func (fs *fenceSigner) token(f scheduler.Fence) string {
	fh := fs.pool.Get().(*fenceHasher)
	fh.sum(f)
	t := string(fh.hex[:])
	fs.pool.Put(fh)
	return t
}

// valid reports whether token is the fence of booking f (in constant time).
func (fs *fenceSigner) valid(f scheduler.Fence, token string) bool {
	fh := fs.pool.Get().(*fenceHasher)
	fh.sum(f)
	ok := subtle.ConstantTimeCompare(fh.hex[:], unsafeBytes(token)) == 1
	fs.pool.Put(fh)
	return ok
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

// checkOwner admits a lifecycle call on request lr.RequestID, booked as fe
// when booked: an operator's (admin) always; a cancel presenting the
// request key its id was made from, always (the owner, queued or routed);
// otherwise the booking's fence (checkFence). A cancel of a request with no
// booking (queued, or unknown) needs its key: without one it is a
// bad_request (unless Config.AllowUnfencedLifecycle), with a wrong one a
// not_found, the answer for an unknown request. Other calls on a request
// with no booking are answered not_found by the caller.
func (r *Replica) checkOwner(op string, fe scheduler.Fence, booked bool, lr *api.LifecycleRequest, admin bool) *api.Error {
	switch {
	case admin:
		return nil
	case op == api.OpCancel && lr.Fence != "" && api.RequestKeyMatches(lr.RequestID, lr.Fence):
		return nil
	case booked:
		return r.checkFence(fe, lr)
	case op != api.OpCancel:
		return nil
	case lr.Fence == "" && !r.cfg.AllowUnfencedLifecycle:
		return api.BadField("fence", "is required: cancelling request %q needs the request key its id was made from (api.NewRequestID) "+
			"or the fence of its route reply", lr.RequestID)
	case lr.Fence != "":
		return api.NewError(api.CodeNotFound, "request "+strconv.Quote(lr.RequestID)+" has no queued request or booking with this fence or key on replica "+r.id, nil).OnField("fence")
	}
	return nil
}

// unsafeBytes views s as bytes for a reader that does not keep or modify
// them (a hash), without copying.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
