package api

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// decoder is a small strict JSON reader for RouteRequest. It accepts the
// JSON grammar (RFC 8259), skips unknown keys of any shape, treats null as
// "absent", matches keys exactly (unlike encoding/json, which folds case),
// and reports the first problem as a bad_request *Error naming the field.
// It never panics on any input (fuzzed) and allocates only the strings it
// keeps and slice growth beyond the caller's capacity.
type decoder struct {
	buf     []byte
	pos     int
	scratch []byte // unescaped string bytes
	depth   int

	sawTokenIDs    bool // the route request's JSON gives token_ids (null is absence)
	sawBlockHashes bool // and block_hashes
}

const maxDepth = 64 // nesting limit when skipping unknown values

// DecodeRouteRequest parses a route request into r, reusing the capacity of
// r's slices (reset r's fields before reuse: this function overwrites only
// the fields present in data). The result is validated for syntax and
// ranges; semantic checks (model known, block size matching) happen in
// Replica.Route.
//
// data may end with a binary trailer (AppendRouteBody): a mark byte, which
// JSON never contains, ends the JSON, and the token ids (TokenTrailerMark,
// four little-endian bytes each) or the block hashes (HashTrailerMark,
// eight) follow it. A request gives its token ids, and its hashes, one way
// or the other, not both.
func DecodeRouteRequest(data []byte, r *RouteRequest) error {
	if len(data) > MaxRouteBodySize {
		return BadField("body", "is %d bytes, the limit is %d", len(data), MaxRouteBodySize)
	}
	body, trailer, mark, hasTrailer := splitTrailer(data)
	d := decoder{buf: body}
	if e := d.routeRequest(r); e != nil {
		return e
	}
	if !hasTrailer {
		return nil
	}
	var e *Error
	if mark == TokenTrailerMark {
		r.TokenIDs, e = readTrailer(trailer, r.TokenIDs, "token_ids", "token", MaxTokens, d.sawTokenIDs)
	} else {
		r.BlockHashes, e = readTrailer(trailer, r.BlockHashes, "block_hashes", "hash", MaxBlockHashes, d.sawBlockHashes)
	}
	if e != nil {
		return e
	}
	return nil
}

// The binary trailers' marks: the byte between a route body's JSON and
// what follows it in binary (AppendRouteBody; docs/protocol.md "The binary
// trailers"). JSON text contains neither, so the first of them in a body
// ends its JSON.
const (
	TokenTrailerMark = 0x00 // then each token id as a little-endian uint32
	HashTrailerMark  = 0x01 // then each block hash as a little-endian uint64
)

// splitTrailer splits a route body at its first trailer mark, if any. A
// token trailer's ids and a hash trailer's hashes may hold either mark's
// byte, so the earlier of the two is the mark.
func splitTrailer(data []byte) (body, trailer []byte, mark byte, ok bool) {
	i := bytes.IndexByte(data, TokenTrailerMark)
	head := data
	if i >= 0 {
		head = data[:i]
	}
	if j := bytes.IndexByte(head, HashTrailerMark); j >= 0 {
		i = j
	}
	if i < 0 {
		return data, nil, 0, false
	}
	return data[:i], data[i+1:], data[i], true
}

// littleEndian reports whether this machine stores integers as the binary
// trailers do.
var littleEndian = binary.NativeEndian.Uint32([]byte{1, 0, 0, 0}) == 1

// readTrailer reads a trailer of little-endian T into dst's memory: the
// token ids (T uint32) or block hashes (uint64) of field, at most limit of
// them, and not also given in the JSON (inJSON).
func readTrailer[T uint32 | uint64](trailer []byte, dst []T, field, what string, limit int, inJSON bool) ([]T, *Error) {
	size := int(unsafe.Sizeof(T(0)))
	switch n := len(trailer) / size; {
	case inJSON:
		return dst, BadField(field, "is given both in the JSON and in the %s trailer", what)
	case len(trailer)%size != 0:
		return dst, BadField(field, "%s trailer is %d bytes, not a whole number of %d-byte values", what, len(trailer), size)
	case n > limit:
		return dst, BadField(field, "has more than %d entries", limit)
	default:
		out := slices.Grow(dst[:0], n)[:n]
		if littleEndian && n > 0 {
			// The trailer is the values' own memory layout here: one copy
			// instead of a load and store per value.
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), size*n), trailer)
			return out, nil
		}
		for i := range out {
			if size == 4 {
				out[i] = T(binary.LittleEndian.Uint32(trailer[4*i:]))
			} else {
				out[i] = T(binary.LittleEndian.Uint64(trailer[8*i:]))
			}
		}
		return out, nil
	}
}

// clear is what a null value does to the field of key: slices and
// references become absent, as encoding/json does (other fields keep their
// value, also as encoding/json does).
func (r *RouteRequest) clear(key []byte) {
	switch string(key) {
	case "token_ids":
		r.TokenIDs = r.TokenIDs[:0]
	case "block_hashes":
		r.BlockHashes = r.BlockHashes[:0]
	case "media":
		r.Media = r.Media[:0]
	case "allowed_workers":
		r.AllowedWorkers = r.AllowedWorkers[:0]
	case "pin":
		r.Pin = nil
	case "prefer":
		r.Prefer = nil
	}
}

// Reset clears r for reuse, keeping the capacity of its slices unless
// they grew large.
func (r *RouteRequest) Reset() {
	*r = RouteRequest{
		TokenIDs:       keepSmall(r.TokenIDs, maxKeptTokens),
		BlockHashes:    keepSmall(r.BlockHashes, maxKeptTokens/16),
		Media:          keepSmall(r.Media, 64),
		AllowedWorkers: keepSmall(r.AllowedWorkers, 1024),
	}
}

// maxKeptTokens bounds the token ids a reset request keeps room for: a
// pooled request that once held a huge prompt drops it, so a burst of large
// bodies leaves no memory behind.
const maxKeptTokens = 64 << 10

// keepSmall is s emptied, or nil when its capacity is past limit.
func keepSmall[T any](s []T, limit int) []T {
	if cap(s) > limit {
		return nil
	}
	return s[:0]
}

func (d *decoder) errf(field, format string, args ...any) *Error {
	if field == "" {
		field = "body"
	}
	return BadField(field, format, args...)
}

func (d *decoder) skipWS() {
	for d.pos < len(d.buf) {
		switch d.buf[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
// end checks that only white space follows the value just read: a body is
// one JSON document.
func (d *decoder) end(field string) *Error {
	d.skipWS()
	if d.pos != len(d.buf) {
		return d.errf(field, "invalid JSON: trailing data at offset %d", d.pos)
	}
	return nil
}

func (d *decoder) peek() byte {
	d.skipWS()
	if d.pos >= len(d.buf) {
		return 0
	}
	return d.buf[d.pos]
}

func (d *decoder) expect(field string, c byte) *Error {
	if d.peek() != c {
		return d.unexpected(field, "'"+string(c)+"'")
	}
	d.pos++
	return nil
}

func (d *decoder) unexpected(field, want string) *Error {
	if d.pos >= len(d.buf) {
		return d.errf(field, "invalid JSON: unexpected end of input, want %s", want)
	}
	return d.errf(field, "invalid JSON at offset %d: unexpected %q, want %s", d.pos, d.buf[d.pos], want)
}

// isNull consumes a null literal when it comes next.
func (d *decoder) isNull() bool {
	if d.peek() == 'n' && d.pos+4 <= len(d.buf) && string(d.buf[d.pos:d.pos+4]) == "null" {
		d.pos += 4
		return true
	}
	return false
}

// object iterates the keys of an object, calling fn with each key (valid
// only during the call) positioned at its value.
func (d *decoder) object(field string, fn func(key []byte) *Error) *Error {
	if e := d.expect(field, '{'); e != nil {
		return e
	}
	if d.peek() == '}' {
		d.pos++
		return nil
	}
	for {
		if d.peek() != '"' {
			return d.unexpected(field, "an object key")
		}
		key, e := d.rawString(field)
		if e != nil {
			return e
		}
		if e := d.expect(field, ':'); e != nil {
			return e
		}
		d.skipWS()
		if e := fn(key); e != nil {
			return e
		}
		switch d.peek() {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return nil
		default:
			return d.unexpected(field, "',' or '}'")
		}
	}
}

// array iterates the elements of an array, calling fn positioned at each.
func (d *decoder) array(field string, fn func(i int) *Error) *Error {
	if e := d.expect(field, '['); e != nil {
		return e
	}
	if d.peek() == ']' {
		d.pos++
		return nil
	}
	for i := 0; ; i++ {
		d.skipWS()
		if e := fn(i); e != nil {
			return e
		}
		switch d.peek() {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return nil
		default:
			return d.unexpected(field, "',' or ']'")
		}
	}
}

// rawString reads a string and returns its unescaped bytes; the slice is
// valid until the next call (it aliases the input or d.scratch).
func (d *decoder) rawString(field string) ([]byte, *Error) {
	if d.pos >= len(d.buf) || d.buf[d.pos] != '"' {
		return nil, d.unexpected(field, "a string")
	}
	d.pos++
	start := d.pos
	// Fast path: no escapes, ASCII or valid UTF-8 without control bytes.
	for d.pos < len(d.buf) {
		c := d.buf[d.pos]
		if c == '"' {
			s := d.buf[start:d.pos]
			d.pos++
			if !utf8.Valid(s) {
				return nil, d.errf(field, "string is not valid UTF-8")
			}
			return s, nil
		}
		if c == '\\' {
			return d.unescapeString(field, start)
		}
		if c < 0x20 {
			return nil, d.errf(field, "invalid JSON: control byte 0x%02x in string at offset %d", c, d.pos)
		}
		d.pos++
	}
	return nil, d.errf(field, "invalid JSON: unterminated string")
}

// unescapeString is rawString past the string's first escape, at d.pos:
// it copies the string from start into d.scratch, unescaping as it goes.
func (d *decoder) unescapeString(field string, start int) ([]byte, *Error) {
	d.scratch = append(d.scratch[:0], d.buf[start:d.pos]...)
	for d.pos < len(d.buf) {
		c := d.buf[d.pos]
		switch {
		case c == '"':
			d.pos++
			if !utf8.Valid(d.scratch) {
				return nil, d.errf(field, "string is not valid UTF-8")
			}
			return d.scratch, nil
		case c < 0x20:
			return nil, d.errf(field, "invalid JSON: control byte 0x%02x in string at offset %d", c, d.pos)
		case c != '\\':
			d.scratch = append(d.scratch, c)
			d.pos++
			continue
		}
		d.pos++
		if d.pos >= len(d.buf) {
			break
		}
		esc := d.buf[d.pos]
		d.pos++
		switch esc {
		case '"', '\\', '/':
			d.scratch = append(d.scratch, esc)
		case 'b':
			d.scratch = append(d.scratch, '\b')
		case 'f':
			d.scratch = append(d.scratch, '\f')
		case 'n':
			d.scratch = append(d.scratch, '\n')
		case 'r':
			d.scratch = append(d.scratch, '\r')
		case 't':
			d.scratch = append(d.scratch, '\t')
		case 'u':
			r, ok := d.unicodeEscape()
			if !ok {
				return nil, d.errf(field, "invalid JSON: bad \\u escape at offset %d", d.pos)
			}
			d.scratch = utf8.AppendRune(d.scratch, r)
		default:
			return nil, d.errf(field, "invalid JSON: bad escape '\\%c' at offset %d", esc, d.pos-1)
		}
	}
	return nil, d.errf(field, "invalid JSON: unterminated string")
}

// unicodeEscape reads the four hex digits of a \u escape (d.pos is past
// the 'u') and, for a high surrogate, the low one of its pair. A pair is
// \uD8xx\uDCxx; a lone surrogate becomes U+FFFD as in encoding/json, and
// what follows it is read as it is. ok is false for bad hex digits.
func (d *decoder) unicodeEscape() (r rune, ok bool) {
	if r, ok = d.hex4(); !ok || !utf16.IsSurrogate(r) {
		return r, ok
	}
	save := d.pos
	if d.pos+1 < len(d.buf) && d.buf[d.pos] == '\\' && d.buf[d.pos+1] == 'u' {
		d.pos += 2
		if r2, ok := d.hex4(); ok {
			if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
				return dec, true
			}
		}
		d.pos = save
	}
	return utf8.RuneError, true
}

func (d *decoder) hex4() (rune, bool) {
	if d.pos+4 > len(d.buf) {
		return 0, false
	}
	var r rune
	for _, c := range d.buf[d.pos : d.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	d.pos += 4
	return r, true
}

// str reads a string value of at most max bytes into a new string.
func (d *decoder) str(field string, max int) (string, *Error) {
	b, e := d.rawString(field)
	if e != nil {
		return "", e
	}
	if len(b) > max {
		return "", d.errf(field, "is %d bytes long, the limit is %d", len(b), max)
	}
	return string(b), nil
}

// uint reads a non-negative JSON integer no larger than max. Fractions and
// exponents are rejected, as encoding/json does for integer fields. A quoted
// decimal is accepted when quoted is true (JavaScript clients send uint64
// values as strings to keep their precision).
func (d *decoder) uint(field string, max uint64, quoted bool) (uint64, *Error) {
	if quoted && d.pos < len(d.buf) && d.buf[d.pos] == '"' {
		b, e := d.rawString(field)
		if e != nil {
			return 0, e
		}
		v, err := strconv.ParseUint(string(b), 10, 64)
		if err != nil || v > max {
			return 0, d.errf(field, "%q is not an integer in [0, %d]", b, max)
		}
		return v, nil
	}
	start := d.pos
	if d.pos < len(d.buf) && d.buf[d.pos] == '-' {
		return 0, d.errf(field, "must not be negative")
	}
	var v uint64
	n := 0
	for d.pos < len(d.buf) {
		c := d.buf[d.pos]
		if c < '0' || c > '9' {
			break
		}
		if n == 1 && d.buf[start] == '0' {
			return 0, d.errf(field, "invalid JSON number at offset %d: leading zero", start)
		}
		dv := uint64(c - '0')
		if v > (max-dv)/10 {
			return 0, d.errf(field, "is larger than %d", max)
		}
		v = v*10 + dv
		d.pos++
		n++
	}
	if n == 0 {
		return 0, d.unexpected(field, "a non-negative integer")
	}
	if d.pos < len(d.buf) {
		if c := d.buf[d.pos]; c == '.' || c == 'e' || c == 'E' {
			return 0, d.errf(field, "must be an integer")
		}
	}
	return v, nil
}

// int reads a JSON integer with |v| <= max.
func (d *decoder) int(field string, max int) (int, *Error) {
	neg := false
	if d.pos < len(d.buf) && d.buf[d.pos] == '-' {
		neg = true
		d.pos++
	}
	u, e := d.uint(field, uint64(max), false)
	if e != nil {
		return 0, e
	}
	if neg {
		return -int(u), nil
	}
	return int(u), nil
}

// uintArray reads an array of integers in [0, max T] with a tight loop
// for the common shape (plain digits, commas, optional spaces); anything
// else goes through the general path, which also reads decimal strings
// when quoted. Token ids (uint32) and block hashes (uint64) share it.
func uintArray[T uint32 | uint64](d *decoder, field string, dst []T, maxLen int, quoted bool) ([]T, *Error) {
	if e := d.expect(field, '['); e != nil {
		return dst, e
	}
	if d.peek() == ']' {
		d.pos++
		return dst, nil
	}
	// The fast path's digits: up to 10 for uint32 (checked against the
	// maximum), up to 19 for uint64 (they cannot overflow) and a 20th
	// checked on its own. A longer number is left to the general path,
	// which says what is wrong with it.
	maxV, fastDigits := uint64(^T(0)), 19
	if maxV == math.MaxUint32 {
		fastDigits = 10
	}
	buf := d.buf
	for {
		if len(dst) >= maxLen {
			return dst, d.errf(field, "has more than %d entries", maxLen)
		}
		// Fast path: plain digits ended by ',' or ']' (what every encoder
		// writes); anything else (spaces, signs, fractions, strings,
		// errors) goes through the general path below.
		p := d.pos
		if p < len(buf) {
			if v := uint64(buf[p] - '0'); v <= 9 {
				q := p + 1
				for lim := min(len(buf), p+fastDigits); q < lim; q++ {
					dg := uint64(buf[q] - '0')
					if dg > 9 {
						break
					}
					v = v*10 + dg
				}
				if q == p+19 && q < len(buf) { // a uint64's 20th digit
					if dg := uint64(buf[q] - '0'); dg <= 9 && v <= (math.MaxUint64-dg)/10 {
						v = v*10 + dg
						q++
					}
				}
				if q < len(buf) && v <= maxV && (q-p == 1 || buf[p] != '0') {
					if c := buf[q]; c == ',' {
						dst = append(dst, T(v))
						d.pos = q + 1
						continue
					} else if c == ']' {
						dst = append(dst, T(v))
						d.pos = q + 1
						return dst, nil
					}
				}
			}
		}
		d.skipWS()
		u, e := d.uint(field, maxV, quoted)
		if e != nil {
			return dst, e
		}
		dst = append(dst, T(u))
		switch d.peek() {
		case ',':
			d.pos++
			d.skipWS()
		case ']':
			d.pos++
			return dst, nil
		default:
			return dst, d.unexpected(field, "',' or ']'")
		}
	}
}

// skipValue skips one JSON value of any shape, checking its syntax.
func (d *decoder) skipValue(field string) *Error {
	d.depth++
	defer func() { d.depth-- }()
	if d.depth > maxDepth {
		return d.errf(field, "invalid JSON: nested deeper than %d", maxDepth)
	}
	switch c := d.peek(); {
	case c == '{':
		return d.object(field, func([]byte) *Error { return d.skipValue(field) })
	case c == '[':
		return d.array(field, func(int) *Error { return d.skipValue(field) })
	case c == '"':
		_, e := d.rawString(field)
		return e
	case c == 't':
		return d.literal(field, "true")
	case c == 'f':
		return d.literal(field, "false")
	case c == 'n':
		return d.literal(field, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number(field)
	}
	return d.unexpected(field, "a JSON value")
}

func (d *decoder) literal(field, lit string) *Error {
	if d.pos+len(lit) > len(d.buf) || string(d.buf[d.pos:d.pos+len(lit)]) != lit {
		return d.unexpected(field, lit)
	}
	d.pos += len(lit)
	return nil
}

// number checks and skips one JSON number.
func (d *decoder) number(field string) *Error {
	start := d.pos
	if d.buf[d.pos] == '-' {
		d.pos++
	}
	digits := func() int {
		n := 0
		for d.pos < len(d.buf) && d.buf[d.pos] >= '0' && d.buf[d.pos] <= '9' {
			d.pos++
			n++
		}
		return n
	}
	intStart := d.pos
	n := digits()
	if n == 0 || (n > 1 && d.buf[intStart] == '0') {
		return d.errf(field, "invalid JSON number at offset %d", start)
	}
	if d.pos < len(d.buf) && d.buf[d.pos] == '.' {
		d.pos++
		if digits() == 0 {
			return d.errf(field, "invalid JSON number at offset %d", start)
		}
	}
	if d.pos < len(d.buf) && (d.buf[d.pos] == 'e' || d.buf[d.pos] == 'E') {
		d.pos++
		if d.pos < len(d.buf) && (d.buf[d.pos] == '+' || d.buf[d.pos] == '-') {
			d.pos++
		}
		if digits() == 0 {
			return d.errf(field, "invalid JSON number at offset %d", start)
		}
	}
	return nil
}

// routeRequest reads one route request into r. It reads best whole: one
// case per field of RouteRequest in a single switch over the key, the hot
// path's decoder (BenchmarkDecodeRouteRequest), with each field's check
// beside its read.
func (d *decoder) routeRequest(r *RouteRequest) *Error {
	if d.peek() != '{' {
		return d.unexpected("body", "a JSON object")
	}
	e := d.object("body", func(key []byte) *Error {
		if d.isNull() {
			r.clear(key)
			return nil
		}
		var e *Error
		switch string(key) {
		case "v":
			r.V, e = d.int("v", 1<<20)
		case "request_id":
			r.RequestID, e = d.str("request_id", MaxRequestIDLen)
		case "model":
			r.Model, e = d.str("model", MaxModelLen)
		case "token_ids":
			d.sawTokenIDs = true
			r.TokenIDs, e = uintArray(d, "token_ids", r.TokenIDs[:0], MaxTokens, false)
		case "block_hashes":
			d.sawBlockHashes = true
			r.BlockHashes, e = uintArray(d, "block_hashes", r.BlockHashes[:0], MaxBlockHashes, true)
		case "media":
			r.Media, e = d.media(r.Media)
		case "block_size":
			r.BlockSize, e = d.int("block_size", MaxBlockSize)
		case "input_tokens":
			r.InputTokens, e = d.int("input_tokens", MaxTokens)
		case "lora_name":
			r.LoraName, e = d.str("lora_name", 1024)
		case "cache_salt":
			r.CacheSalt, e = d.str("cache_salt", 1024)
		case "session_id":
			r.SessionID, e = d.str("session_id", MaxSessionIDLen)
		case "session_mode":
			r.SessionMode, e = d.str("session_mode", MaxSessionMode)
		case "routing_key":
			r.RoutingKey, e = d.str("routing_key", MaxRoutingKeyLen)
		case "pin":
			r.Pin = new(WorkerRef)
			e = d.workerRef("pin", r.Pin)
		case "prefer":
			r.Prefer = new(WorkerRef)
			e = d.workerRef("prefer", r.Prefer)
		case "allowed_workers":
			r.AllowedWorkers = r.AllowedWorkers[:0]
			e = d.array("allowed_workers", func(i int) *Error {
				if i >= MaxAllowed {
					return d.errf("allowed_workers", "has more than %d entries", MaxAllowed)
				}
				w, e := d.str("allowed_workers", MaxWorkerIDLen)
				r.AllowedWorkers = append(r.AllowedWorkers, w)
				return e
			})
			if e == nil && len(r.AllowedWorkers) == 0 {
				// [] would read as "no worker allowed": refuse it rather
				// than guess (absent or null allows every worker).
				e = d.errf("allowed_workers", "must name at least one worker; omit it to allow every worker")
			}
		case "priority":
			r.Priority, e = d.int("priority", MaxPriority)
		case "expected_output_tokens":
			r.ExpectedOutputTokens, e = d.int("expected_output_tokens", MaxOutputTokens)
		case "deadline_ms":
			r.DeadlineMS, e = d.int("deadline_ms", int(MaxDeadline/time.Millisecond))
		case "pd":
			r.PD, e = d.boolean("pd")
		default:
			e = d.skipValue(string(key))
		}
		return e
	})
	if e != nil {
		return e
	}
	return d.end("body")
}

// MaxLifecycleBodySize bounds a lifecycle call body (HTTP body or NATS
// payload).
const MaxLifecycleBodySize = 64 << 10

// DecodeRouteResponse parses a route answer into resp (reset first). It is
// what Client uses.
func DecodeRouteResponse(data []byte, resp *RouteResponse) error {
	*resp = RouteResponse{}
	d := decoder{buf: data}
	if e := d.routeResponse(resp); e != nil {
		return e
	}
	return nil
}

// DecodeLifecycleRequest parses a lifecycle call body into lr (fields not
// present are left as they are; an empty body has none). HTTP and NATS both
// read the body with it.
func DecodeLifecycleRequest(data []byte, lr *LifecycleRequest) error {
	if len(data) > MaxLifecycleBodySize {
		return BadField("body", "is %d bytes, the limit is %d", len(data), MaxLifecycleBodySize)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	d := decoder{buf: data}
	if e := d.lifecycleRequest(lr); e != nil {
		return e
	}
	return nil
}

// DecodeJSON reads one JSON document into v with encoding/json: the
// decoder of every message but the three on every route's path (route
// request, route answer, lifecycle call), whose hand-written decoders are
// measured faster. Errors are bad_request *Error values naming
// the field at fault ("body" when it is the document itself).
func DecodeJSON(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return jsonError(err) // trailing data included: json.Unmarshal reads one document
	}
	return nil
}

// jsonError turns an encoding/json error into a bad_request naming the field.
func jsonError(err error) *Error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var ae *Error
	switch {
	case errors.As(err, &ae):
		return ae // a field's own UnmarshalJSON (WorkerRef)
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "body"
		}
		return BadField(field, "is a JSON %s, want %s", te.Value, te.Type)
	case errors.As(err, &se):
		return BadField("body", "invalid JSON at offset %d: %v", se.Offset, se)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return BadField("body", "invalid JSON: unexpected end of input")
	}
	return BadField("body", "invalid JSON: %v", err)
}

func (d *decoder) workerRef(field string, w *WorkerRef) *Error {
	seen := false
	e := d.object(field, func(key []byte) *Error {
		if d.isNull() {
			return nil
		}
		var e *Error
		switch string(key) {
		case "worker":
			w.Worker, e = d.str(field+".worker", MaxWorkerIDLen)
			seen = true
		case "rank":
			var v uint64
			v, e = d.uint(field+".rank", 1<<32-1, false)
			w.Rank, w.HasRank = uint32(v), true
		default:
			e = d.skipValue(field + "." + string(key))
		}
		return e
	})
	if e != nil {
		return e
	}
	if !seen || w.Worker == "" {
		return d.errf(field+".worker", "is required")
	}
	return nil
}

// boolean reads true or false.
func (d *decoder) boolean(field string) (bool, *Error) {
	if d.pos < len(d.buf) && d.buf[d.pos] == 't' {
		return true, d.literal(field, "true")
	}
	if d.pos < len(d.buf) && d.buf[d.pos] == 'f' {
		return false, d.literal(field, "false")
	}
	return false, d.unexpected(field, "true or false")
}
