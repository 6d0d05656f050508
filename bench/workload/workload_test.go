package workload

import (
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// traceDir finds ../shared/data/mooncake by walking up from the package
// directory; tests that need it skip when it is absent.
func traceDir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		for _, c := range []string{filepath.Join(dir, "shared", "data", "mooncake"), filepath.Join(dir, "..", "shared", "data", "mooncake")} {
			if _, err := os.Stat(filepath.Join(c, "PROVENANCE.md")); err == nil {
				return c
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("Mooncake traces not found (../shared/data/mooncake)")
		}
		dir = parent
	}
}

func TestMooncakeReaderErrors(t *testing.T) {
	cases := []struct {
		name, in, field string
	}{
		{"not json", "{oops\n", ""},
		{"missing timestamp", `{"input_length":10,"output_length":1,"hash_ids":[0]}`, "timestamp"},
		{"missing hash ids", `{"timestamp":0,"input_length":10,"output_length":1}`, "hash_ids"},
		{"negative input", `{"timestamp":0,"input_length":-1,"output_length":1,"hash_ids":[0]}`, "input_length"},
		{"zero input", `{"timestamp":0,"input_length":0,"output_length":1,"hash_ids":[]}`, "input_length"},
		{"negative output", `{"timestamp":0,"input_length":10,"output_length":-3,"hash_ids":[0]}`, "output_length"},
		{"wrong id count", `{"timestamp":0,"input_length":513,"output_length":1,"hash_ids":[0]}`, "hash_ids"},
		{"negative id", `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[-1]}`, "hash_ids"},
		{"string length", `{"timestamp":0,"input_length":"10","output_length":1,"hash_ids":[0]}`, "input_length"},
		{"time goes back", "{\"timestamp\":5,\"input_length\":10,\"output_length\":1,\"hash_ids\":[0]}\n{\"timestamp\":4,\"input_length\":10,\"output_length\":1,\"hash_ids\":[0]}", "timestamp"},
		{"predecessor changes", "{\"timestamp\":0,\"input_length\":600,\"output_length\":1,\"hash_ids\":[0,1]}\n{\"timestamp\":0,\"input_length\":600,\"output_length\":1,\"hash_ids\":[2,1]}", "hash_ids"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mr := NewMooncakeReader(strings.NewReader(c.in), "x.jsonl", MooncakeOptions{})
			var rec MooncakeRecord
			var err error
			for err == nil {
				err = mr.Next(&rec)
			}
			if !errors.Is(err, ErrTraceFormat) {
				t.Fatalf("err = %v, want ErrTraceFormat", err)
			}
			var le *LineError
			if !errors.As(err, &le) || le.Field != c.field || le.Path != "x.jsonl" || le.Line < 1 {
				t.Fatalf("err = %#v, want field %q", err, c.field)
			}
			// Lenient mode skips the line and goes on to EOF.
			mr = NewMooncakeReader(strings.NewReader(c.in), "", MooncakeOptions{Lenient: true})
			for err = nil; err == nil; err = mr.Next(&rec) {
			}
			if !errors.Is(err, io.EOF) || mr.Skipped() != 1 || len(mr.SkipErrors()) != 1 {
				t.Fatalf("lenient: err %v skipped %d", err, mr.Skipped())
			}
		})
	}
}

func TestMooncakeReaderLongLineAndBlanks(t *testing.T) {
	in := "\n{\"timestamp\":0,\"input_length\":10,\"output_length\":1,\"hash_ids\":[0]}\n\n" +
		`{"timestamp":1,"input_length":10,"output_length":1,"hash_ids":[0],"pad":"` + strings.Repeat("x", 300) + "\"}\n" +
		`{"timestamp":2,"input_length":10,"output_length":2,"hash_ids":[0]}`
	mr := NewMooncakeReader(strings.NewReader(in), "", MooncakeOptions{MaxLineBytes: 200, Lenient: true})
	var got []int64
	var rec MooncakeRecord
	for {
		err := mr.Next(&rec)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, rec.Timestamp)
	}
	if !reflect.DeepEqual(got, []int64{0, 2}) || mr.Skipped() != 1 {
		t.Fatalf("got %v skipped %d", got, mr.Skipped())
	}
	mr = NewMooncakeReader(strings.NewReader(in), "", MooncakeOptions{MaxLineBytes: 200})
	var err error
	for err == nil {
		err = mr.Next(&rec)
	}
	if !errors.Is(err, ErrTraceFormat) || !strings.Contains(err.Error(), "longer than 200") {
		t.Fatalf("strict long line: %v", err)
	}
}

func TestDecodeMooncakeSelect(t *testing.T) {
	in := `{"timestamp":1000,"input_length":600,"output_length":5,"hash_ids":[0,1]}
{"timestamp":2000,"input_length":1100,"output_length":6,"hash_ids":[0,1,2]}
{"timestamp":3000,"input_length":100,"output_length":7,"hash_ids":[3]}
{"timestamp":9000,"input_length":100,"output_length":7,"hash_ids":[4]}
`
	w, err := DecodeMooncake(strings.NewReader(in), "t", ReadOptions{Start: 2 * time.Second, Window: 5 * time.Second, Sessions: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 2 || w.Requests[0].ID != "mc-2" || w.Requests[0].Arrival != 0 || w.Requests[1].Arrival != time.Second {
		t.Fatalf("%+v", w.Requests)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeMooncake(strings.NewReader(in), "t", ReadOptions{Start: time.Hour}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty selection: %v", err)
	}
	w, _ = DecodeMooncake(strings.NewReader(in), "t", ReadOptions{Limit: 3})
	if len(w.Requests) != 3 {
		t.Fatalf("limit: %d", len(w.Requests))
	}
}

func TestInferSessions(t *testing.T) {
	w := &Workload{BlockTokens: 512, Requests: []Request{
		{ID: "a", BlockIDs: []uint64{0, 1, 2}},
		{ID: "b", BlockIDs: []uint64{0, 3}},
		{ID: "c", BlockIDs: []uint64{0, 1, 2, 4}}, // continues a
		{ID: "d", BlockIDs: []uint64{0, 3, 5}},    // continues b
		{ID: "e", BlockIDs: []uint64{0, 6}},       // shares only the root
		{ID: "f", BlockIDs: []uint64{0, 1, 7}},    // continues a's session (via c)
	}}
	if d := rootDepth(w); d != 2 { // id 1 sits at depth 1 in half of these few requests
		t.Fatalf("root depth %d", d)
	}
	if n := InferSessions(w, 2); n != 3 {
		t.Fatalf("sessions = %d", n)
	}
	s := func(i int) string { return w.Requests[i].Session }
	if s(0) != s(2) || s(1) != s(3) || s(0) == s(1) || s(4) == s(0) || s(4) == s(1) || s(5) != s(0) {
		t.Fatalf("sessions %v %v %v %v %v %v", s(0), s(1), s(2), s(3), s(4), s(5))
	}
}

func TestUpperBound(t *testing.T) {
	w := &Workload{BlockTokens: 512, Requests: []Request{
		{ID: "a", InputLength: 1000, BlockIDs: []uint64{0, 1}}, // full 16-blocks: 62
		{ID: "b", InputLength: 1024, BlockIDs: []uint64{0, 1}}, // 64 blocks, 62 seen
		{ID: "c", InputLength: 600, BlockIDs: []uint64{0, 2}},  // 37 blocks, 32 seen (id 0)
	}}
	b := w.UpperBound(16)
	if b.PromptBlocks != 62+64+37 || b.ReusableBlocks != 62+32 {
		t.Fatalf("%+v", b)
	}
	if tb := w.TraceBound(); tb.PromptBlocks != 6 || tb.ReusableBlocks != 3 {
		t.Fatalf("trace bound %+v", tb)
	}
	b = w.UpperBound(512)
	if b.PromptBlocks != 1+2+1 || b.ReusableBlocks != 2 {
		t.Fatalf("512: %+v", b)
	}
	tw := &Workload{Requests: []Request{
		{ID: "x", Tokens: make([]uint32, 40), InputLength: 40},
		{ID: "y", Tokens: make([]uint32, 50), InputLength: 50},
	}}
	if b := tw.UpperBound(16); b.PromptBlocks != 5 || b.ReusableBlocks != 2 {
		t.Fatalf("tokens: %+v", b)
	}
}

func TestMooncakeTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("reads both full traces (slow under -race)")
	}
	dir := traceDir(t)
	for _, c := range []struct {
		file     string
		requests int
		ceiling  float64
	}{
		{"mooncake_fast25_conversation_trace.jsonl", 12031, 0.366},
		{"mooncake_fast25_synthetic_trace.jsonl", 3993, 0.640},
	} {
		w, err := ReadMooncake(filepath.Join(dir, c.file), ReadOptions{Sessions: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(w.Requests) != c.requests {
			t.Fatalf("%s: %d requests", c.file, len(w.Requests))
		}
		if err := w.Validate(); err != nil {
			t.Fatal(err)
		}
		if b := w.TraceBound(); math.Abs(b.Ratio-c.ceiling) > 0.001 {
			t.Fatalf("%s: trace ceiling %.4f, provenance says %.3f", c.file, b.Ratio, c.ceiling)
		}
		b512, b16 := w.UpperBound(512), w.UpperBound(16)
		t.Logf("%s: %d sessions; engine ceiling at 512 %.4f, at 16 %.4f", w.Name, w.Sessions(), b512.Ratio, b16.Ratio)
		if b512.Ratio <= 0.3 || b16.Ratio <= 0.3 {
			t.Fatalf("engine ceilings %v %v", b512, b16)
		}
	}
}

func TestSyntheticDeterministicAndValid(t *testing.T) {
	for _, kind := range Kinds {
		t.Run(kind, func(t *testing.T) {
			a, err := Generate(kind, 7)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := Generate(kind, 7)
			c, _ := Generate(kind, 8)
			if err := a.Validate(); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatal("same seed, different workload")
			}
			if reflect.DeepEqual(a.Requests[0].Tokens, c.Requests[0].Tokens) && a.Requests[0].Arrival == c.Requests[0].Arrival {
				t.Fatal("different seed, same first request")
			}
			ub := a.UpperBound(16)
			t.Logf("%s: %d requests, %d sessions, span %v, ceiling %.3f", a.Name, len(a.Requests), a.Sessions(), a.Span(), ub.Ratio)
			if ub.Ratio < 0.3 {
				t.Fatalf("ceiling %.3f too low for a prefix workload", ub.Ratio)
			}
		})
	}
	if _, err := Generate("nope", 1); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

func TestSharedPrefixShape(t *testing.T) {
	w := SharedPrefix(SharedPrefixConfig{Seed: 1})
	if len(w.Requests) != 64*16 {
		t.Fatalf("%d requests", len(w.Requests))
	}
	groups := map[string][]uint32{}
	for _, r := range w.Requests {
		if r.InputLength != 2048+128 || r.OutputLength != 256 {
			t.Fatalf("%+v", r.InputLength)
		}
		if p, ok := groups[r.Group]; ok && !reflect.DeepEqual(p, r.Tokens[:2048]) {
			t.Fatal("group prefix differs")
		}
		groups[r.Group] = r.Tokens[:2048]
	}
	// 63 of every 64 prefix blocks... each group's prefix (128 blocks) is new once.
	b := w.UpperBound(16)
	want := float64(64*15*128) / float64(64*16*136)
	if math.Abs(b.Ratio-want) > 1e-9 {
		t.Fatalf("ceiling %v want %v", b.Ratio, want)
	}
}

func TestChatTurnsExtend(t *testing.T) {
	w := Chat(ChatConfig{Seed: 3, Sessions: 4})
	last := map[string][]uint32{}
	for _, r := range w.Requests {
		if p, ok := last[r.Session]; ok {
			if len(r.Tokens) <= len(p) || !reflect.DeepEqual(r.Tokens[:len(p)], p) {
				t.Fatalf("%s does not extend the previous turn", r.ID)
			}
		}
		last[r.Session] = r.Tokens
	}
}

func TestSelectAndScale(t *testing.T) {
	w := FanOut(FanOutConfig{Seed: 1, Agents: 4})
	s := w.Select(10, time.Second, 0)
	if len(s.Requests) != 10 || s.Requests[0].Arrival != 0 {
		t.Fatalf("select: %d %v", len(s.Requests), s.Requests[0].Arrival)
	}
	span := w.Span()
	if err := w.ScaleLoad(2); err != nil || w.Span() != span/2 && w.Span() != span/2+1 && w.Span() != span/2-1 {
		t.Fatalf("scale: %v %v %v", err, span, w.Span())
	}
	if err := w.ScaleLoad(0); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

func FuzzMooncakeReader(f *testing.F) {
	f.Add([]byte(`{"timestamp":0,"input_length":600,"output_length":5,"hash_ids":[0,1]}`))
	f.Add([]byte("{\"timestamp\":1}\n\n{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, lenient := range []bool{false, true} {
			mr := NewMooncakeReader(strings.NewReader(string(data)), "", MooncakeOptions{Lenient: lenient, MaxLineBytes: 1 << 12})
			var rec MooncakeRecord
			for i := 0; i < 1000; i++ {
				err := mr.Next(&rec)
				if err != nil {
					if !errors.Is(err, io.EOF) && !errors.Is(err, ErrTraceFormat) {
						t.Fatalf("unexpected error type %v", err)
					}
					break
				}
				if len(rec.HashIDs) != (rec.InputLength+511)/512 || rec.InputLength <= 0 {
					t.Fatalf("accepted bad record %+v", rec)
				}
			}
		}
	})
}

func TestSampleSessions(t *testing.T) {
	w := Chat(ChatConfig{Seed: 5, Sessions: 30, Turns: 4})
	s := w.SampleSessions(10, 2, 1)
	if s.Sessions() != 10 || s.Requests[0].Arrival != 0 {
		t.Fatalf("%d sessions, first at %v", s.Sessions(), s.Requests[0].Arrival)
	}
	again := w.SampleSessions(10, 2, 1)
	if !reflect.DeepEqual(s, again) {
		t.Fatal("not deterministic")
	}
	if other := w.SampleSessions(10, 2, 2); reflect.DeepEqual(s, other) {
		t.Fatal("seed ignored")
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if all := w.SampleSessions(0, 1, 1); len(all.Requests) != len(w.Requests) {
		t.Fatalf("all: %d of %d", len(all.Requests), len(w.Requests))
	}
	if none := w.SampleSessions(5, 1000, 1); len(none.Requests) != 0 {
		t.Fatal("min requests ignored")
	}
}
