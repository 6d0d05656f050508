package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/buildinfo"
)

// `kvrouter --version` and `kvrouter version` print the release and the
// commit, exit 0.
func TestVersion(t *testing.T) {
	in := buildinfo.Get()
	for _, arg := range []string{"--version", "version", "-version"} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), []string{arg}, &out, &errOut); code != 0 {
			t.Fatalf("%s: exit %d: %s", arg, code, errOut.String())
		}
		if got := strings.TrimSpace(out.String()); got != in.String() || !strings.Contains(got, in.Version) || !strings.Contains(got, in.Commit) {
			t.Fatalf("%s printed %q, want %q", arg, got, in.String())
		}
	}
}
