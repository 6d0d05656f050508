package main

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestImage builds the image the way `go run ./deploy/image` does, reads
// both outputs back, checks the config a runtime acts on (entrypoint, user,
// labels, platform) and the files, then runs the binary inside with
// --version.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvrouter")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Root: root, Out: t.TempDir(), Arch: runtime.GOARCH, Version: "v9.8.7-test+abc", Commit: "0123456789abcdef",
		Source: DefaultSource, Licenses: DefaultLicenses, Repository: "kvrouter", Created: time.Unix(1700000000, 0).UTC()}
	res, err := Build(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tag != "index.docker.io/library/kvrouter:v9.8.7-test-abc" && res.Tag != "kvrouter:v9.8.7-test-abc" {
		t.Errorf("tag %q, want kvrouter:v9.8.7-test-abc", res.Tag)
	}

	img := fromLayout(t, res.Layout)
	fromTar, err := tarball.ImageFromPath(res.Tarball, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := digest(t, img); d != res.Digest {
		t.Errorf("OCI layout digest %s, Build said %s", d, res.Digest)
	}
	// A docker-archive tarball rebuilds the manifest (Docker media types),
	// so the same image shows as the same config.
	if c1, c2 := configName(t, img), configName(t, fromTar); c1 != c2 {
		t.Errorf("config digests: OCI layout %s, tarball %s", c1, c2)
	}
	checkConfig(t, img, o)
	files := readFiles(t, img)
	checkFiles(t, files)

	if runtime.GOOS != "linux" {
		t.Skip("the image's binary is linux/" + o.Arch)
	}
	bin := filepath.Join(t.TempDir(), "kvrouter")
	if err := os.WriteFile(bin, files["kvrouter"].body, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("kvrouter --version from the image: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "kvrouter "+o.Version+" (commit "+o.Commit+",") {
		t.Errorf("kvrouter --version printed %q, want version %s and commit %s", out, o.Version, o.Commit)
	}
}

// Two builds of one commit give the same digest (file times and the
// creation time come from the commit, not the clock).
func TestImageReproducible(t *testing.T) {
	o := Options{Arch: "arm64", Version: "v1", Commit: "c", Source: DefaultSource, Licenses: DefaultLicenses, Created: time.Unix(1, 0)}
	a, err := Image([]byte("binary"), o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Image([]byte("binary"), o)
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, a) != digest(t, b) {
		t.Fatal("two builds of the same input differ")
	}
	cf, err := a.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Architecture != "arm64" {
		t.Fatalf("architecture %q, want --arch's arm64", cf.Architecture)
	}
}

func TestTagSafe(t *testing.T) {
	for in, want := range map[string]string{"v0.4.0": "v0.4.0", "v0.4.0-3-gabc+dirty": "v0.4.0-3-gabc-dirty", "": "v", "-x/y": "v-x-y"} {
		if got := tagSafe(in); got != want {
			t.Errorf("tagSafe(%q) = %q, want %q", in, got, want)
		}
	}
}

func fromLayout(t *testing.T, dir string) v1.Image {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("OCI layout holds %d manifests, want 1", len(m.Manifests))
	}
	if ref := m.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; ref != "v9.8.7-test-abc" {
		t.Errorf("OCI layout ref.name %q, want the version tag", ref)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func configName(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func checkConfig(t *testing.T, img v1.Image, o Options) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != o.Arch {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, o.Arch)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/kvrouter"}) {
		t.Errorf("entrypoint %q, want [/kvrouter]", cf.Config.Entrypoint)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want the non-root 65532:65532", cf.Config.User)
	}
	want := map[string]string{
		"org.opencontainers.image.version": o.Version, "org.opencontainers.image.revision": o.Commit,
		"org.opencontainers.image.source": DefaultSource, "org.opencontainers.image.title": "kvrouter",
		"org.opencontainers.image.licenses": DefaultLicenses, "org.opencontainers.image.created": "2023-11-14T22:13:20Z",
	}
	for k, v := range want {
		if got := cf.Config.Labels[k]; got != v {
			t.Errorf("label %s = %q, want %q", k, got, v)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 || len(cf.RootFS.DiffIDs) != 1 {
		t.Errorf("%d layers, %d diff ids, want one each (empty base + the binary)", len(layers), len(cf.RootFS.DiffIDs))
	}
}

type file struct {
	hdr  *tar.Header
	body []byte
}

// readFiles flattens the image's filesystem.
func readFiles(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]file{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimSuffix(h.Name, "/")] = file{h, body}
	}
	return files
}

func checkFiles(t *testing.T, files map[string]file) {
	t.Helper()
	bin, ok := files["kvrouter"]
	if !ok || bin.hdr.Mode&0o111 == 0 || len(bin.body) < 1<<20 {
		t.Fatalf("no executable /kvrouter in the image (found %v)", ok)
	}
	if !strings.HasPrefix(string(bin.body), "\x7fELF") {
		t.Error("/kvrouter is not an ELF binary")
	}
	if tmp := files["tmp"]; tmp.hdr == nil || tmp.hdr.Mode&0o1777 != 0o1777 {
		t.Error("/tmp missing or not world-writable with the sticky bit")
	}
	if home := files["home/nonroot"]; home.hdr == nil || home.hdr.Uid != 65532 {
		t.Error("/home/nonroot missing or not owned by 65532")
	}
	if !strings.Contains(string(files["etc/passwd"].body), "nonroot:x:65532:65532:") {
		t.Error("/etc/passwd does not name the user 65532")
	}
}
