// Command image builds kvrouter's container image from this repository with
// Go alone: no daemon, no base image to download. It builds the static
// binary (CGO_ENABLED=0, -trimpath, version and commit stamped with -ldflags
// -X into internal/buildinfo) and appends one layer holding it onto an
// empty image, running as the non-root user 65532.
//
//	go run ./deploy/image                      # dist/kvrouter-image (OCI layout) and dist/kvrouter-<version>-linux-<arch>.tar
//	go run ./deploy/image --arch arm64 --version v0.4.0
//	podman load -i dist/kvrouter-*.tar         # or docker load -i; crane push dist/kvrouter-*.tar REF
//
// Flags default from git: --version from `git describe --tags --dirty`
// (else "devel"), --commit from `git rev-parse HEAD`, the creation time from
// SOURCE_DATE_EPOCH or the commit's time, so two builds of one commit give
// the same image digest. deploy/image/Dockerfile is the conventional
// multi-stage build of the same image for Docker users.
//
// It owns the image's layout and config (build.go: Image, Labels) and the
// command line (main.go); the version it stamps is read back by
// internal/buildinfo. It is not part of the kvrouter binary. Start at
// Build, then Image; image_test.go builds the image and runs its binary.
package main
