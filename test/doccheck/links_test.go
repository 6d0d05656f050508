package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// docs are the documents that must stand alone.
var docs = []string{"README.md", "docs/protocol.md"}

var (
	// mdLink matches the target of an inline Markdown link: [text](target).
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// outside matches a path that leaves the repository, in a link or in
	// code spans alike ("../shared/reference/wire-formats.md").
	outside = regexp.MustCompile("(^|[\\s(`'\"])\\.\\./[^\\s)`'\"]*")
	// codePath matches a file named in a code span: `docs/benchmarks.md`,
	// `router/host/maperr.go`, `protocol-workers.md`.
	codePath = regexp.MustCompile("`([A-Za-z0-9_][A-Za-z0-9_./-]*\\.md|[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]*\\.go)`")
)

// TestDocsStayInsideTheRepository: no document points at a file outside
// the repository (an outside reader has none of them), and every relative
// link names a file that exists.
func TestDocsStayInsideTheRepository(t *testing.T) {
	for _, rel := range docs {
		text := readDoc(t, rel)
		for i, line := range strings.Split(text, "\n") {
			if m := outside.FindString(line); m != "" {
				t.Errorf("%s:%d names a path outside the repository (%s): %s", rel, i+1, strings.TrimSpace(m), line)
			}
		}
		for _, m := range codePath.FindAllStringSubmatch(text, -1) {
			if !existsFrom(rel, m[1]) {
				t.Errorf("%s names the file %q, which is not in the repository", rel, m[1])
			}
		}
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, _, _ := strings.Cut(target, "#")
			full := filepath.Join(repoRoot, filepath.Dir(rel), path)
			if _, err := os.Stat(full); err != nil {
				t.Errorf("%s links to %q, which is not in the repository: %v", rel, target, err)
			}
		}
	}
}

// existsFrom reports whether path names a file relative to the repository
// root or to the directory of the document rel.
func existsFrom(rel, path string) bool {
	for _, base := range []string{repoRoot, filepath.Join(repoRoot, filepath.Dir(rel))} {
		if _, err := os.Stat(filepath.Join(base, path)); err == nil {
			return true
		}
	}
	return false
}

// TestAnchorsResolve: every in-document link (#anchor) names a heading of
// the same document, with GitHub's heading-to-anchor rule.
func TestAnchorsResolve(t *testing.T) {
	for _, rel := range docs {
		text := readDoc(t, rel)
		anchors := headingAnchors(text)
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if !strings.HasPrefix(target, "#") {
				continue
			}
			if !anchors[target[1:]] {
				t.Errorf("%s: link %q names no heading", rel, target)
			}
		}
	}
}

func TestHeadingAnchor(t *testing.T) {
	tests := []struct{ heading, want string }{
		{"Error codes", "error-codes"},
		{"Booking sync (`<prefix>.bookings.<model>`)", "booking-sync-prefixbookingsmodel"},
		{"4. Errors", "4-errors"},
		{"Worker side: the lease, as NATS messages", "worker-side-the-lease-as-nats-messages"},
		{"Prefix-index snapshots (package `router/index`, issue 3)", "prefix-index-snapshots-package-routerindex-issue-3"},
	}
	for _, tc := range tests {
		if got := anchorOf(tc.heading); got != tc.want {
			t.Errorf("anchorOf(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

// headingAnchors returns the anchors of every heading outside code blocks;
// a repeated heading gets -1, -2, ... as on GitHub.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := anchorOf(h)
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// anchorOf is GitHub's anchor of a heading: lower case, letters, digits,
// '-' and '_' kept, spaces turned into '-', everything else dropped.
func anchorOf(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
