// Package progress draws a plain text progress bar on a writer (stderr in
// the CLI), with no dependency and no terminal control beyond '\r'.
//
// It owns only the drawing: what is counted, and when, is the caller's
// (bench/replay). Start at New.
package progress
