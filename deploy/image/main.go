package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	o := Options{Root: root}
	arch := os.Getenv("GOARCH")
	if arch == "" {
		arch = runtime.GOARCH
	}
	out := fs.String("out", "dist", "output directory (relative to the repository root)")
	fs.StringVar(&o.Arch, "arch", arch, "GOARCH of the binary and the image (default $GOARCH, else this machine's)")
	fs.StringVar(&o.Version, "version", gitOr(root, "devel", "describe", "--tags", "--dirty"), "release version: binary, label and tag")
	fs.StringVar(&o.Commit, "commit", gitCommit(root), "commit the binary is built from")
	fs.StringVar(&o.Source, "source", DefaultSource, "org.opencontainers.image.source label")
	fs.StringVar(&o.Licenses, "licenses", DefaultLicenses, "org.opencontainers.image.licenses label (an SPDX expression)")
	fs.StringVar(&o.Repository, "repository", "kvrouter", "image name of the tarball's tag (<repository>:<version>)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.Created = created(root)
	o.Out = *out
	if !filepath.IsAbs(o.Out) {
		o.Out = filepath.Join(root, o.Out)
	}
	res, err := Build(ctx, o)
	if err != nil {
		return err
	}
	fmt.Printf("image %s (linux/%s, %s)\n  OCI layout: %s\n  tarball:    %s (tag %s)\n", res.Digest, o.Arch, o.Version, res.Layout, res.Tarball, res.Tag)
	return nil
}

// repoRoot is the module root holding cmd/kvrouter: `go run ./deploy/image`
// runs with the working directory wherever the user is inside the checkout.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the kvrouter module (go env GOMOD = %q)", mod)
	}
	return filepath.Dir(mod), nil
}

// gitOr runs git in root and returns its trimmed output, or def when git
// fails (no git, no tags, a source tarball).
func gitOr(root, def string, args ...string) string {
	out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
	if s := strings.TrimSpace(string(out)); err == nil && s != "" {
		return s
	}
	return def
}

// gitCommit is HEAD, "-dirty" appended when tracked files differ from it
// (the toolchain's vcs.modified rule).
func gitCommit(root string) string {
	c := gitOr(root, "unknown", "rev-parse", "HEAD")
	if c != "unknown" && gitOr(root, "", "status", "--porcelain", "--untracked-files=no") != "" {
		c += "-dirty"
	}
	return c
}

// created is SOURCE_DATE_EPOCH, else the commit's time, else the Unix
// epoch: never the wall clock, so that a rebuild gives the same digest.
func created(root string) time.Time {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		s = gitOr(root, "0", "log", "-1", "--format=%ct")
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		sec = 0
	}
	return time.Unix(sec, 0).UTC()
}
