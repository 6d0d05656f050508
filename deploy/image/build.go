package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// DefaultSource is the org.opencontainers.image.source label.
	DefaultSource = "https://github.com/kvrouter/kvrouter"
	// DefaultLicenses is SPDX's "not stated": the repository carries no
	// licence file yet; --licenses sets the real one.
	DefaultLicenses = "NOASSERTION"
	// User is the numeric user and group the image runs as (distroless'
	// nonroot), numeric so that runAsNonRoot can check it without a passwd.
	User = "65532:65532"
	// Entrypoint is where the binary sits in the image.
	Entrypoint = "/kvrouter"

	buildinfoPkg = "github.com/kvrouter/kvrouter/internal/buildinfo"
)

// Options say what to build and where to write it.
type Options struct {
	Root       string // repository root (holds go.mod and cmd/kvrouter)
	Out        string // output directory
	Arch       string // GOARCH
	Version    string
	Commit     string
	Source     string
	Licenses   string
	Repository string    // image name in the tarball's tag
	Created    time.Time // image and file times
}

// Result is what Build wrote.
type Result struct {
	Digest  v1.Hash
	Layout  string // OCI image layout directory
	Tarball string // docker-archive tarball (docker load, podman load, crane push)
	Tag     string
}

// Build compiles kvrouter for linux/o.Arch, makes its image and writes it
// as an OCI layout directory and as a tarball under o.Out.
func Build(ctx context.Context, o Options) (Result, error) {
	bin, err := compile(ctx, o)
	if err != nil {
		return Result{}, err
	}
	img, err := Image(bin, o)
	if err != nil {
		return Result{}, err
	}
	return write(img, o)
}

// compile builds the static binary with the version and commit stamped in.
func compile(ctx context.Context, o Options) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "kvrouter-image-")
	if err != nil {
		return nil, fmt.Errorf("image: temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "kvrouter")
	ldflags := fmt.Sprintf("-s -w -X %s.Version=%s -X %s.Commit=%s", buildinfoPkg, o.Version, buildinfoPkg, o.Commit)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", bin, "./cmd/kvrouter")
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("image: go build (linux/%s): %w\n%s", o.Arch, err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("image: read the binary: %w", err)
	}
	return b, nil
}

// Image is the empty base plus one layer holding bin at Entrypoint, a
// passwd and group naming the non-root user, its home and a /tmp (the
// embedded NATS server's default store), with the config that runs it.
func Image(bin []byte, o Options) (v1.Image, error) {
	layerTar, err := rootfs(bin, o.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: o.Created}, CreatedBy: "go run ./deploy/image", Comment: "kvrouter " + o.Version}})
	if err != nil {
		return nil, fmt.Errorf("image: append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", o.Arch, v1.Time{Time: o.Created}
	cf.Config.Entrypoint = []string{Entrypoint}
	cf.Config.Cmd = []string{"--help"}
	cf.Config.User = User
	cf.Config.WorkingDir = "/home/nonroot"
	cf.Config.Labels = Labels(o)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: set config: %w", err)
	}
	return img, nil
}

// Labels are the OCI image spec's pre-defined annotations, as config labels.
func Labels(o Options) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "kvrouter",
		"org.opencontainers.image.description": "KV-cache-aware LLM request router",
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Commit,
		"org.opencontainers.image.source":      o.Source,
		"org.opencontainers.image.licenses":    o.Licenses,
		"org.opencontainers.image.created":     o.Created.Format(time.RFC3339),
	}
}

// rootfs is the layer's tar.
func rootfs(bin []byte, mtime time.Time) ([]byte, error) {
	const uid = 65532
	entries := []struct {
		name     string
		mode     int64
		uid      int
		contents string
		dir      bool
	}{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, contents: "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
		{name: "etc/group", mode: 0o644, contents: "root:x:0:\nnonroot:x:65532:\n"},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: uid, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: strings.TrimPrefix(Entrypoint, "/"), mode: 0o755, contents: string(bin)},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: mtime, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.contents))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("image: tar %s: %w", e.name, err)
		}
		if _, err := io.WriteString(tw, e.contents); err != nil {
			return nil, fmt.Errorf("image: tar %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: tar: %w", err)
	}
	return buf.Bytes(), nil
}

// write puts img under o.Out as an OCI layout (replacing an old one) and
// as a tarball tagged <repository>:<version>.
func write(img v1.Image, o Options) (Result, error) {
	d, err := img.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("image: digest: %w", err)
	}
	tagText := o.Repository + ":" + tagSafe(o.Version)
	tag, err := name.NewTag(tagText)
	if err != nil {
		return Result{}, fmt.Errorf("image: tag %q: %w", tagText, err)
	}
	res := Result{Digest: d, Tag: tag.String(),
		Layout:  filepath.Join(o.Out, "kvrouter-image"),
		Tarball: filepath.Join(o.Out, fmt.Sprintf("kvrouter-%s-linux-%s.tar", tagSafe(o.Version), o.Arch))}
	if err := os.RemoveAll(res.Layout); err != nil {
		return Result{}, fmt.Errorf("image: clear %s: %w", res.Layout, err)
	}
	p, err := layout.Write(res.Layout, empty.Index)
	if err != nil {
		return Result{}, fmt.Errorf("image: OCI layout %s: %w", res.Layout, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag.TagStr()})); err != nil {
		return Result{}, fmt.Errorf("image: OCI layout %s: %w", res.Layout, err)
	}
	if err := tarball.WriteToFile(res.Tarball, tag, img); err != nil {
		return Result{}, fmt.Errorf("image: tarball %s: %w", res.Tarball, err)
	}
	return res, nil
}

// tagSafe maps a version onto the tag alphabet ([A-Za-z0-9_.-], at most
// 128, not starting with . or -): git describe's "+" and "/" become "-".
func tagSafe(v string) string {
	b := []byte(v)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	s := string(b)
	if s == "" || s[0] == '.' || s[0] == '-' {
		s = "v" + s
	}
	if len(s) > 128 {
		s = s[:128]
	}
	return s
}
