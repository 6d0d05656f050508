package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A token comes from its flag or its file (trimmed), never both; an empty
// or missing file is an error naming the flag.
func TestSecret(t *testing.T) {
	dir := t.TempDir()
	good, empty := filepath.Join(dir, "tok"), filepath.Join(dir, "empty")
	if err := os.WriteFile(good, []byte("  s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, value, file, want string
		fails                   bool
	}{
		{"none", "", "", "", false},
		{"flag", "abc", "", "abc", false},
		{"file", "", good, "s3cret", false},
		{"both", "abc", good, "", true},
		{"empty file", "", empty, "", true},
		{"missing file", "", filepath.Join(dir, "nope"), "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := secret("http-token", c.value, "http-token-file", c.file)
			if (err != nil) != c.fails || got != c.want {
				t.Fatalf("secret = %q, %v; want %q (fails %v)", got, err, c.want, c.fails)
			}
		})
	}
}
