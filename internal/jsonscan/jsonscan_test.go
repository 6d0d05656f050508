package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMembers(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "k=v;" per member, or "!" when refused
	}{
		{`{}`, ``},
		{" \t\n{ }\r\n", ``},
		{`{"a":1}`, `a=1;`},
		{`{"a" : [1, 2,3] , "b":{"c":[{}]},"a":null}`, `a=[1, 2,3];b={"c":[{}]};a=null;`},
		{`{"s":"x\"y\\u00e9\n"}`, `s="x\"y\\u00e9\n";`},
		{`{"n":-0.5e+10,"m":0,"t":true,"f":false}`, `n=-0.5e+10;m=0;t=true;f=false;`},
		{`{"k\u0041":1}`, `!`},           // a key with an escape goes to encoding/json
		{`[1]`, `!`},                     // not an object
		{`null`, `!`},                    // not an object
		{`{"a":1}x`, `!`},                // trailing data
		{`{"a":1}{}`, `!`},               // two values
		{`{"a":01}`, `!`},                // leading zero
		{`{"a":1.}`, `!`},                // fraction without digits
		{`{"a":1e}`, `!`},                // exponent without digits
		{`{"a":-}`, `!`},                 // sign alone
		{`{"a":[1,]}`, `!`},              // trailing comma
		{`{"a":1,}`, `!`},                // trailing comma
		{`{"a":"x` + "\x01" + `"}`, `!`}, // control character in a string
		{`{"a":"\x"}`, `!`},              // bad escape
		{`{"a":"\u12"}`, `!`},            // short \u
		{`{"a":tru}`, `!`},               // cut literal
		{`{"a" 1}`, `!`},                 // no colon
		{`{"a":{"b" 1}}`, `!`},           // no colon inside
		{`{"a":[1 2]}`, `!`},             // no comma
		{`{"a":`, `!`},                   // cut
		{`{"a":"`, `!`},                  // cut string
		{`{"a":[` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `]}`, `!`}, // too deep
	} {
		var got strings.Builder
		ok := Members([]byte(tc.in), func(k, v []byte) bool {
			got.WriteString(string(k) + "=" + string(v) + ";")
			return true
		})
		if !ok {
			got.Reset()
			got.WriteString("!")
		}
		if got.String() != tc.want {
			t.Errorf("Members(%q) = %q, want %q", tc.in, got.String(), tc.want)
		}
	}
}

// A callback's false stops the walk and is the answer; value slices cannot
// be appended to in place.
func TestMembersStopAndCapacity(t *testing.T) {
	n := 0
	if Members([]byte(`{"a":1,"b":2}`), func(_, _ []byte) bool { n++; return false }) || n != 1 {
		t.Fatalf("callback false: ok or %d calls", n)
	}
	body := []byte(`{"a":[1],"b":2}`)
	Members(body, func(k, v []byte) bool {
		if string(k) == "a" {
			_ = append(v, 'X')
		}
		return true
	})
	if string(body) != `{"a":[1],"b":2}` {
		t.Fatalf("append wrote into the body: %s", body)
	}
}

// FuzzMembers holds the scanner to encoding/json: whatever it takes is a
// valid JSON object whose members (last wins) json.Unmarshal reads the
// same; a valid object without escapes or deep nesting it takes.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{}`, `{"model":"m","prompt":[1,2,3],"stream":true}`, `{"a":{"b":[1.5e3,-0,"\u00e9",null]}}`,
		`{"a":1,"a":2}`, `{"k\n":1}`, `[]`, `{"a":"\ud800"}`, "{\"a\":\"\xff\"}", `{"a":1 }  `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got := map[string]json.RawMessage{}
		ok := Members(data, func(k, v []byte) bool {
			if cap(v) != len(v) {
				t.Fatalf("value %q has capacity %d past its end", v, cap(v)-len(v))
			}
			got[string(k)] = v
			return true
		})
		var want map[string]json.RawMessage
		err := json.Unmarshal(data, &want)
		valid := json.Valid(data)
		if ok {
			if !valid || err != nil || want == nil {
				t.Fatalf("took %q: json.Valid %v, Unmarshal %v", data, valid, err)
			}
			for k, v := range got {
				if !utf8.ValidString(k) {
					continue // encoding/json replaces invalid UTF-8 in keys
				}
				if w, has := want[k]; !has || !bytes.Equal(w, v) {
					t.Fatalf("member %q: %q, encoding/json %q (%v)", k, v, w, has)
				}
			}
			return
		}
		if valid && err == nil && want != nil && !bytes.Contains(data, []byte(`\`)) &&
			bytes.Count(data, []byte("["))+bytes.Count(data, []byte("{")) < maxDepth {
			t.Fatalf("refused %q, a valid object without escapes", data)
		}
	})
}
