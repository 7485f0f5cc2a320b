#!/bin/sh
# Where an engine's per-stage time goes: `perf record -a -g` of a 1,000-wide fan-out of
# `true` at --parallelism P (default 16; after a first run that makes the home), then the kernel
# entry points that the containment layers use, as shares of all CPU time (bench/README.md,
# "Containment"). Usage: bench/profile_fanout.sh [BINARY [P]]  (default target/release/drivetrain;
# needs perf and root). Set TMPDIR to a tmpfs (not under /dev) to leave ext4's inode allocation out.
set -eu
bin=${1:-target/release/drivetrain}
par=${2:-16}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
case "$dir" in
  /dev/*|/proc/*|/sys/*)
    echo "TMPDIR is under /dev ($dir): the engine refuses a home there for isolated stages; use a tmpfs elsewhere (mount -t tmpfs tmpfs /tmp/tmpfs; TMPDIR=/tmp/tmpfs)" >&2
    exit 1 ;;
esac
python3 - "$dir/wide.yaml" <<'PY'
import sys
lines = ["version: 1", "name: wide", "stages:"]
for i in range(1000):
    lines += [f"  s{i:04d}:", "    run: {command: [/bin/true]}"]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
"$bin" --home "$dir/warm" run "$dir/wide.yaml" --parallelism "$par" >/dev/null 2>&1
perf record -q -a -g -o "$dir/perf.data" -- "$bin" --home "$dir/home" run "$dir/wide.yaml" --parallelism "$par" >/dev/null 2>&1
perf report -i "$dir/perf.data" --children --sort sym --stdio 2>/dev/null \
  | grep -E '^ +[0-9]' \
  | grep -E '__x64_sys_(mkdir|rmdir|mount|exit_group|execve|openat)$|do_seccomp|cgroup_mkdir|cgroup_rmdir|cgroup_addrm_files|recently_deleted|pv_native_safe_halt|fc_mount$|cleanup_mnt$|deactivate_locked_super$|copy_mnt_ns$|shmem_fill_super$|userns::give' \
  | head -30
