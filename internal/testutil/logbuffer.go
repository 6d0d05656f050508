package testutil

import (
	"bytes"
	"sync"
)

// LogBuffer collects log lines written from several goroutines (a
// slog.TextHandler's writer) for a test to read, e.g. to print what a
// component logged when a step of the test failed.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
