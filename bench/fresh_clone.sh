#!/usr/bin/env bash
# How long `bash .ci/run` takes on a fresh clone, from nothing the project installs: a new
# clone, a HOME of its own (so no venvs, no Azurite, no build outputs under
# ~/.cache/drivetrain, and cold pip and npm caches). What the machine itself has stays:
# the Rust toolchain and the crates already downloaded (CARGO_HOME, RUSTUP_HOME), and the
# Debian packages (.ci/run's apt lines install only what is missing).
#
#   bash bench/fresh_clone.sh            # prints the wall time, the installs' and the build's
#
# Needs about 20 GiB free under /tmp; removes what it made when it ends.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/drivetrain-fresh.XXXXXX)"
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
export CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
export RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
export PATH="$CARGO_HOME/bin:$PATH"
export HOME="$work/home"
mkdir -p "$HOME"
unset CARGO_TARGET_DIR
echo "fresh clone of $(git -C "$repo" rev-parse --short HEAD) in $work, $(nproc) cores"
start=$SECONDS
set +e
bash "$work/clone/.ci/run" >"$work/ci.log" 2>&1
rc=$?
set -e
took=$((SECONDS - start))
grep -E "^installs took|^tests:" "$work/ci.log" || true
printf 'bash .ci/run on a fresh clone: %d min %02d s (exit %d)\n' $((took / 60)) $((took % 60)) "$rc"
if [ "$rc" -ne 0 ]; then
  grep -E "FAILED|panicked" "$work/ci.log" | head -20 || true
fi
exit "$rc"
