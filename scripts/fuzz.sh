#!/usr/bin/env bash
# Runs every checked-in fuzz target for FUZZTIME each (default 30s).
# go test -fuzz takes one target in one package at a time, hence the loop.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-30s}
for f in $(git ls-files '*_test.go'); do
  dir=./$(dirname "$f")
  for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f"); do
    echo "== $dir $target"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$dir"
  done
done
