package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

var (
	// ErrInvalid reports a workload that breaks an invariant (see Validate).
	ErrInvalid = errors.New("workload: invalid")
	// ErrTraceFormat reports a trace line that cannot be used; the concrete
	// error is a *LineError naming the line and field.
	ErrTraceFormat = errors.New("workload: bad trace line")
)

// LineError says which line of a trace is bad and why. errors.Is(err,
// ErrTraceFormat) holds for every LineError.
type LineError struct {
	Path   string // may be empty when reading from a reader
	Line   int    // 1-based
	Field  string // JSON field at fault, or "" for the line as a whole
	Reason string
	Err    error // underlying decode error, if any
}

func (e *LineError) Error() string {
	where := "line " + strconv.Itoa(e.Line)
	if e.Path != "" {
		where = e.Path + ":" + strconv.Itoa(e.Line)
	}
	msg := where + ": "
	if e.Field != "" {
		msg += "field " + strconv.Quote(e.Field) + ": "
	}
	msg += e.Reason
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return "workload: bad trace line: " + msg
}

// Unwrap exposes both ErrTraceFormat and the underlying error.
func (e *LineError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrTraceFormat, e.Err}
	}
	return []error{ErrTraceFormat}
}

// MooncakeRecord is one line of a Mooncake FAST'25 trace.
type MooncakeRecord struct {
	Timestamp    int64    // ms since the first request
	InputLength  int      // tokens
	OutputLength int      // tokens
	HashIDs      []uint64 // one per 512-token block, the last one partial
}

// MooncakeOptions tunes the reader. The zero value is strict.
type MooncakeOptions struct {
	// MaxLineBytes bounds one line (default 8 MiB); a longer line is an error.
	MaxLineBytes int
	// Lenient skips bad lines (counting them in Skipped) instead of failing.
	Lenient bool
	// SkipPredecessorCheck turns off the check that every hash id always
	// follows the same predecessor (the property that makes an id name a
	// whole prefix). The check costs one map entry per distinct id.
	SkipPredecessorCheck bool
}

// MooncakeReader streams a Mooncake JSONL trace one record at a time.
type MooncakeReader struct {
	br      *bufio.Reader
	path    string
	opt     MooncakeOptions
	line    int
	lastTS  int64
	pred    map[uint64]uint64 // id -> predecessor+1 (0 = root)
	skipped int
	errs    []error
	raw     rawRecord
}

type rawRecord struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// NewMooncakeReader reads from r. path is only used in error messages.
func NewMooncakeReader(r io.Reader, path string, opt MooncakeOptions) *MooncakeReader {
	if opt.MaxLineBytes <= 0 {
		opt.MaxLineBytes = 8 << 20
	}
	m := &MooncakeReader{br: bufio.NewReaderSize(r, 64<<10), path: path, opt: opt}
	if !opt.SkipPredecessorCheck {
		m.pred = make(map[uint64]uint64)
	}
	return m
}

// Skipped is the number of bad lines skipped in lenient mode.
func (m *MooncakeReader) Skipped() int { return m.skipped }

// SkipErrors returns the first errors of skipped lines (at most 10).
func (m *MooncakeReader) SkipErrors() []error { return m.errs }

// Line is the number of the line last read.
func (m *MooncakeReader) Line() int { return m.line }

// Next decodes the next record into rec (its HashIDs slice is reused when it
// has capacity). It returns io.EOF after the last record, a *LineError for a
// bad line (unless lenient), or a read error.
func (m *MooncakeReader) Next(rec *MooncakeRecord) error {
	for {
		line, err := m.readLine()
		if err != nil {
			return err
		}
		m.line++
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		lerr := m.decode(line, rec)
		if lerr == nil {
			return nil
		}
		if !m.opt.Lenient {
			return lerr
		}
		m.skipped++
		if len(m.errs) < 10 {
			m.errs = append(m.errs, lerr)
		}
	}
}

func (m *MooncakeReader) readLine() ([]byte, error) {
	var buf []byte
	for {
		chunk, err := m.br.ReadSlice('\n')
		if len(buf)+len(chunk) > m.opt.MaxLineBytes {
			// Drain the rest of the line so a lenient reader can go on.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = m.br.ReadSlice('\n')
			}
			m.line++
			lerr := &LineError{Path: m.path, Line: m.line, Reason: fmt.Sprintf("longer than %d bytes", m.opt.MaxLineBytes)}
			if !m.opt.Lenient {
				return nil, lerr
			}
			m.skipped++
			if len(m.errs) < 10 {
				m.errs = append(m.errs, lerr)
			}
			if err != nil {
				return nil, err
			}
			buf = buf[:0]
			continue
		}
		switch {
		case err == nil:
			if buf == nil {
				return chunk, nil
			}
			return append(buf, chunk...), nil
		case errors.Is(err, bufio.ErrBufferFull):
			buf = append(buf, chunk...)
		case errors.Is(err, io.EOF):
			if len(buf)+len(chunk) == 0 {
				return nil, io.EOF
			}
			return append(buf, chunk...), nil
		default:
			return nil, fmt.Errorf("workload: read trace %s: %w", m.path, err)
		}
	}
}

func (m *MooncakeReader) decode(line []byte, rec *MooncakeRecord) error {
	bad := func(field, reason string, err error) error {
		return &LineError{Path: m.path, Line: m.line, Field: field, Reason: reason, Err: err}
	}
	m.raw = rawRecord{HashIDs: rec.HashIDs[:0]}
	if err := json.Unmarshal(line, &m.raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return bad(te.Field, "wrong type", err)
		}
		return bad("", "not a JSON object", err)
	}
	r := &m.raw
	switch {
	case r.Timestamp == nil:
		return bad("timestamp", "missing", nil)
	case r.InputLength == nil:
		return bad("input_length", "missing", nil)
	case r.OutputLength == nil:
		return bad("output_length", "missing", nil)
	case r.HashIDs == nil:
		return bad("hash_ids", "missing", nil)
	case *r.Timestamp < 0:
		return bad("timestamp", fmt.Sprintf("negative (%d)", *r.Timestamp), nil)
	case *r.Timestamp < m.lastTS:
		return bad("timestamp", fmt.Sprintf("%d goes back from %d", *r.Timestamp, m.lastTS), nil)
	case *r.InputLength <= 0:
		return bad("input_length", fmt.Sprintf("%d is not positive", *r.InputLength), nil)
	case *r.OutputLength < 0:
		return bad("output_length", fmt.Sprintf("%d is negative", *r.OutputLength), nil)
	}
	if want := ceilDiv(*r.InputLength, MooncakeBlockTokens); len(r.HashIDs) != want {
		return bad("hash_ids", fmt.Sprintf("%d ids for input_length %d, want %d", len(r.HashIDs), *r.InputLength, want), nil)
	}
	if m.pred != nil {
		// Check first, then record, so a bad line leaves no trace in the map.
		var prev uint64 // predecessor+1; 0 = root
		for i, id := range r.HashIDs {
			if p, ok := m.pred[id]; ok && p != prev {
				return bad("hash_ids", fmt.Sprintf("id %d at index %d follows %s here but %s earlier", id, i, predName(prev), predName(p)), nil)
			}
			prev = id + 1
		}
		prev = 0
		for _, id := range r.HashIDs {
			m.pred[id] = prev
			prev = id + 1
		}
	}
	m.lastTS = *r.Timestamp
	rec.Timestamp = *r.Timestamp
	rec.InputLength = *r.InputLength
	rec.OutputLength = *r.OutputLength
	rec.HashIDs = r.HashIDs
	return nil
}

func predName(p uint64) string {
	if p == 0 {
		return "the root"
	}
	return "id " + strconv.FormatUint(p-1, 10)
}

// ReadOptions selects part of a trace while reading it.
type ReadOptions struct {
	MooncakeOptions
	Name  string        // workload name; default "mooncake:<file name>"
	Limit int           // stop after this many requests (0 = all)
	Start time.Duration // skip requests that arrive before Start
	// Window keeps requests arriving in [Start, Start+Window) (0 = no end).
	Window time.Duration
	// Sessions infers session ids from shared prefixes (see InferSessions).
	Sessions bool
}

// ReadMooncake reads a Mooncake trace into a workload. Arrivals are shifted
// so that the first kept request arrives at 0. Request ids are "mc-<line>".
func ReadMooncake(path string, opt ReadOptions) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: open trace: %w", err)
	}
	defer f.Close()
	name := opt.Name
	if name == "" {
		name = "mooncake:" + baseName(path)
	}
	return readMooncake(f, path, name, opt)
}

// DecodeMooncake is ReadMooncake over a reader.
func DecodeMooncake(r io.Reader, name string, opt ReadOptions) (*Workload, error) {
	return readMooncake(r, "", name, opt)
}

func readMooncake(r io.Reader, path, name string, opt ReadOptions) (*Workload, error) {
	mr := NewMooncakeReader(r, path, opt.MooncakeOptions)
	w := &Workload{Name: name, BlockTokens: MooncakeBlockTokens, MaxTokens: TraceMaxTokens}
	var rec MooncakeRecord
	first := int64(-1)
	for opt.Limit <= 0 || len(w.Requests) < opt.Limit {
		rec.HashIDs = nil // each request keeps its own slice
		err := mr.Next(&rec)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		at := time.Duration(rec.Timestamp) * time.Millisecond
		if at < opt.Start {
			continue
		}
		if opt.Window > 0 && at >= opt.Start+opt.Window {
			break
		}
		if first < 0 {
			first = rec.Timestamp
		}
		w.Requests = append(w.Requests, Request{
			ID:           "mc-" + strconv.Itoa(mr.Line()),
			Arrival:      time.Duration(rec.Timestamp-first) * time.Millisecond,
			BlockIDs:     rec.HashIDs,
			InputLength:  rec.InputLength,
			OutputLength: rec.OutputLength,
		})
	}
	if len(w.Requests) == 0 {
		return nil, fmt.Errorf("%w: trace %s: no request selected (%d lines read, %d skipped)", ErrInvalid, name, mr.Line(), mr.Skipped())
	}
	if opt.Sessions {
		InferSessions(w, 0)
	}
	return w, nil
}

func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' || p[i] == '\\' {
			p = p[i+1:]
			break
		}
	}
	p = trimSuffix(p, ".jsonl")
	p = trimSuffix(p, "_trace")
	return trimPrefix(p, "mooncake_fast25_")
}

func trimSuffix(s, suf string) string {
	if len(s) >= len(suf) && s[len(s)-len(suf):] == suf {
		return s[:len(s)-len(suf)]
	}
	return s
}

func trimPrefix(s, pre string) string {
	if len(s) >= len(pre) && s[:len(pre)] == pre {
		return s[len(pre):]
	}
	return s
}
