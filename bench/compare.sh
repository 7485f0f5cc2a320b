#!/usr/bin/env bash
# Run overhead of two builds, alternated in one session so that both meet the same
# machine: `bench.py --suite run` (a 100-stage chain and a 100-wide fan-out against a
# shell's fork+exec of the same `true`s, and a 1,000-wide fan-out at --parallelism 2 and
# 16 against `xargs -P`), ROUNDS times each, before then after.
#
#   bash bench/compare.sh BEFORE_BINARY AFTER_BINARY [ROUNDS] [REPEATS]
#
# Build each binary with `cargo build --release --bin drivetrain` at its commit (a
# `git worktree` per commit, one CARGO_TARGET_DIR for both keeps the second build short).
set -euo pipefail
before=$1 after=$2 rounds=${3:-2} repeats=${4:-5}
cd "$(dirname "$0")"
# A tmpfs (not under /dev: the engine refuses a home there for isolated stages), or /tmp.
export TMPDIR=${TMPDIR:-/tmp}
for round in $(seq "$rounds"); do
  for which in before after; do
    binary=$([ "$which" = before ] && echo "$before" || echo "$after")
    echo "## round $round, $which ($binary)"
    python3 bench.py --suite run --repeats "$repeats" --binary "$binary" | grep -E '^\|'
  done
done
