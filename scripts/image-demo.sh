#!/usr/bin/env bash
# Builds the container image with `go run ./deploy/image` and runs
# `kvrouter demo` inside it with podman (rootless or root, no daemon):
# the image's binary, user and entrypoint doing real work, not only
# --version. Extra arguments go to `kvrouter demo`.
#
#   scripts/image-demo.sh                 # the default demo (real path)
#   scripts/image-demo.sh --speedup 20
#
# Needs podman (Debian: apt-get install podman). CI does not run it: CI's
# image check is `go test ./deploy/image/`, which needs Go alone.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v podman >/dev/null || { echo "image-demo: podman not found (apt-get install podman)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go run ./deploy/image --out "$out"
tar=$(ls "$out"/kvrouter-*-linux-*.tar)
ref=$(podman load -q -i "$tar" | sed -n 's/^Loaded image[^:]*: *//p' | tail -1)
echo "image-demo: loaded $ref"
podman run --rm --network none --read-only --tmpfs /tmp "$ref" --version
exec podman run --rm --network none --read-only --tmpfs /tmp "$ref" demo --quiet "$@"
