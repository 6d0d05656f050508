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
# PODMAN_RUN_ARGS adds `podman run` flags; in a container sandbox whose
# cgroups crun refuses and whose rlimits are capped, for example:
#   PODMAN_OPTS="--runtime runc" PODMAN_RUN_ARGS="--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"
set -euo pipefail
cd "$(dirname "$0")/.."

command -v podman >/dev/null || { echo "image-demo: podman not found (apt-get install podman)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go run ./deploy/image --out "$out"
tar=$(ls "$out"/kvrouter-*-linux-*.tar)
# shellcheck disable=SC2086 # word splitting of the option lists is meant
pm() { podman ${PODMAN_OPTS:-} "$@"; }
run=(run --rm --network none --read-only --tmpfs /tmp)
ref=$(pm load -q -i "$tar" | sed -n 's/^Loaded image[^:]*: *//p' | tail -1)
echo "image-demo: loaded $ref"
# shellcheck disable=SC2086
pm "${run[@]}" ${PODMAN_RUN_ARGS:-} "$ref" --version
# shellcheck disable=SC2086
pm "${run[@]}" ${PODMAN_RUN_ARGS:-} "$ref" demo --quiet "$@"
