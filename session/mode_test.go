package session

import (
	"errors"
	"testing"
)

func TestModeParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Mode
		err  bool
	}{{"hard", Hard, false}, {"soft", Soft, false}, {"Hard", Unset, true}, {"", Unset, true}, {"sticky", Unset, true}} {
		m, err := ParseMode(c.in)
		if (err != nil) != c.err || m != c.want {
			t.Errorf("ParseMode(%q) = %v, %v", c.in, m, err)
		}
		if err != nil && !errors.Is(err, ErrUnknownMode) {
			t.Errorf("ParseMode(%q) error %v does not wrap ErrUnknownMode", c.in, err)
		}
	}
	if _, err := Mode(9).MarshalText(); !errors.Is(err, ErrUnknownMode) {
		t.Errorf("MarshalText of mode 9: %v", err)
	}
}

// The printed form is the parsed form and the stored one: String, ParseMode
// and the text codec agree for both modes.
func TestModeText(t *testing.T) {
	for _, m := range []Mode{Hard, Soft} {
		b, err := m.MarshalText()
		if err != nil || string(b) != m.String() {
			t.Fatalf("MarshalText(%v) = %q, %v", m, b, err)
		}
		var back Mode
		if err := back.UnmarshalText(b); err != nil || back != m {
			t.Fatalf("UnmarshalText(%q) = %v, %v", b, back, err)
		}
		if p, err := ParseMode(m.String()); err != nil || p != m {
			t.Fatalf("ParseMode(%q) = %v, %v", m, p, err)
		}
	}
	for m, want := range map[Mode]string{Unset: "unset", Mode(7): "mode(7)"} {
		if m.String() != want || m.Valid() {
			t.Errorf("Mode(%d): String %q, Valid %v; want %q, false", uint8(m), m.String(), m.Valid(), want)
		}
	}
}
