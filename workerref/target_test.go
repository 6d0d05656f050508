package workerref

import "testing"

func TestAgrees(t *testing.T) {
	cases := []struct {
		a, b Target
		want bool
	}{
		{Any("w1"), Any("w1"), true},
		{Any("w1"), Of("w1", 3), true},
		{Of("w1", 3), Any("w1"), true},
		{Of("w1", 3), Of("w1", 3), true},
		{Of("w1", 3), Of("w1", 2), false},
		{Any("w1"), Any("w2"), false},
		{Of("w1", 0), Of("w2", 0), false},
	}
	for _, c := range cases {
		if got := c.a.Agrees(c.b); got != c.want {
			t.Errorf("%v.Agrees(%v) = %v, want %v", c.a, c.b, got, c.want)
		}
		if got := c.b.Agrees(c.a); got != c.want {
			t.Errorf("agreement is not symmetric for %v, %v", c.a, c.b)
		}
	}
}

func TestContains(t *testing.T) {
	if !Any("w").Contains("w", 7) || !Of("w", 7).Contains("w", 7) {
		t.Fatal("a target must contain its own ranks")
	}
	if Of("w", 7).Contains("w", 6) || Any("w").Contains("v", 7) {
		t.Fatal("a target must not contain another worker or rank")
	}
}

func TestStringParse(t *testing.T) {
	for _, tc := range []struct {
		t Target
		s string
	}{
		{Any("w1"), "w1"},
		{Of("w1", 0), "w1#0"},
		{Of("a#b", 12), "a#b#12"},
	} {
		if got := tc.t.String(); got != tc.s {
			t.Errorf("String(%#v) = %q, want %q", tc.t, got, tc.s)
		}
		got, err := Parse(tc.s)
		if err != nil || got != tc.t {
			t.Errorf("Parse(%q) = %#v, %v; want %#v", tc.s, got, err, tc.t)
		}
	}
	for _, bad := range []string{"", "#1", "w#", "w#x", "w#-1", "w#4294967296"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted a malformed target", bad)
		}
	}
}
