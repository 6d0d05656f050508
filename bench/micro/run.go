package micro

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
)

// ErrRun reports that `go test -bench` could not be run or failed.
var ErrRun = errors.New("micro: go test")

// RunOptions selects what to benchmark.
type RunOptions struct {
	Dir       string   // module root to run in
	Packages  []string // default ./...
	Bench     string   // -bench regexp, default "."
	Count     int      // -count, default 5
	Benchtime string   // -benchtime, "" = go's default (1s)
	Timeout   string   // -timeout, default 30m
	GoBin     string   // default "go"
}

// Args is the go command line Run executes.
func (o RunOptions) Args() []string {
	bench := o.Bench
	if bench == "" {
		bench = "."
	}
	count := o.Count
	if count <= 0 {
		count = 5
	}
	timeout := o.Timeout
	if timeout == "" {
		timeout = "30m"
	}
	// -p 1: go test otherwise compiles the next packages while an earlier
	// package's benchmarks run, on the same cores.
	args := []string{"test", "-p", "1", "-run", "^$", "-bench", bench, "-benchmem", "-count", strconv.Itoa(count), "-timeout", timeout}
	if o.Benchtime != "" {
		args = append(args, "-benchtime", o.Benchtime)
	}
	pkgs := o.Packages
	if len(pkgs) == 0 {
		pkgs = []string{"./..."}
	}
	return append(args, pkgs...)
}

// Run executes the benchmarks, copying their output to out as it arrives
// (out may be nil) and returning all of it. A failing package does not stop
// the others: the error is returned together with the output so what ran can
// still be reported.
func Run(ctx context.Context, o RunOptions, out io.Writer) ([]byte, error) {
	gobin := o.GoBin
	if gobin == "" {
		gobin = "go"
	}
	cmd := exec.CommandContext(ctx, gobin, o.Args()...)
	cmd.Dir = o.Dir
	var buf capture
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	buf.tee = out
	if err := cmd.Run(); err != nil {
		return buf.b, fmt.Errorf("%w: %s %v: %w", ErrRun, gobin, o.Args(), err)
	}
	return buf.b, nil
}

type capture struct {
	b   []byte
	tee io.Writer
}

func (c *capture) Write(p []byte) (int, error) {
	c.b = append(c.b, p...)
	if c.tee != nil {
		_, _ = c.tee.Write(p) // progress display only
	}
	return len(p), nil
}
