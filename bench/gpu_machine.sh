#!/usr/bin/env bash
# What needs a machine with an NVIDIA GPU, many cores or cgroup v2, in one go (a lent GPU
# machine has no Rust toolchain and no network: build here, bring the binaries):
#   1. the machine: GPU, kernel, cores, cgroups, and `drivetrain doctor` (which layers of
#      containment it gives, and whether NVML records GPU usage);
#   2. tests/it/gpus.rs's `a_stage_records_what_its_gpu_did` and every test of
#      tests/it/isolation.rs (root, cgroup v2 there), from the test binary built with
#      `cargo test --release --test it --no-run`, against the release
#      `drivetrain` at the path they were built with (Python with PyTorch for the GPU
#      test: DRIVETRAIN_TEST_GPU_PYTHON, default python3);
#   3. `bench.py --suite run` with containment (the default) and without
#      (DRIVETRAIN_ISOLATION=off), one after the other on the same machine.
#
# On a cgroup v2 host whose cgroup holds this script's own processes (a lent machine's
# command runs in one), the engine could get no controllers there (v2 hands controllers
# only to the children of a cgroup without processes): the processes are moved into a
# leaf `init` first, as Docker-in-Docker's entrypoint does, and every engine runs in a
# cgroup of its own through bench/own-cgroup.sh, as a systemd unit with Delegate=yes.
#
# Usage: bench/gpu_machine.sh DRIVETRAIN IT_TEST OUT_DIR
# Each binary may be `.xz`-compressed (the copy to the GPU machine is size-limited).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1 it_test=$2 out=$3
mkdir -p "$out"

unpack() { # FILE DEST
  mkdir -p "$(dirname "$2")"
  # Python's lzma rather than xz(1), which a bare image may lack.
  python3 -c 'import lzma, shutil, sys
src = lzma.open if sys.argv[1].endswith(".xz") else open
shutil.copyfileobj(src(sys.argv[1], "rb"), open(sys.argv[2], "wb"))' "$1" "$2"
  chmod +x "$2"
}
# The test binaries run the drivetrain they were built with
# (env!("CARGO_BIN_EXE_drivetrain")): CARGO_TARGET_DIR's release/drivetrain there,
# .ci/run's target dir by default.
built_with=${BUILT_WITH:-/root/.cache/drivetrain/target/release/drivetrain}
real=/tmp/drivetrain-real
unpack "$bin" "$real"
unpack "$it_test" /tmp/it-test

mkdir -p "$(dirname "$built_with")"
cg=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
if [ -f "$cg/cgroup.subtree_control" ] && ! grep -q ' - cgroup ' /proc/self/mountinfo; then
  mkdir -p "$cg/init"
  for p in $(cat "$cg/cgroup.procs"); do echo "$p" >"$cg/init/cgroup.procs" 2>/dev/null; done
  sed -e 's/^/+/' -e 's/ / +/g' "$cg/cgroup.controllers" >"$cg/cgroup.subtree_control"
  printf '#!/bin/sh\nDRIVETRAIN_BIN=%s DRIVETRAIN_CGROUP_PARENT=%s exec %s "$@"\n' \
    "$real" "$cg" "$PWD/bench/own-cgroup.sh" >"$built_with"
  chmod +x "$built_with"
else
  cp "$real" "$built_with"
fi

{
  nvidia-smi -L; uname -r; nproc
  grep cgroup /proc/self/mountinfo | awk '{print $5, $9}'; cat /proc/self/cgroup
  cat "$cg/cgroup.subtree_control" 2>/dev/null
  "$built_with" doctor
} 2>&1 | tee "$out/machine.txt"

{
  DRIVETRAIN_TEST_GPU_PYTHON=${DRIVETRAIN_TEST_GPU_PYTHON:-$(command -v python3)} \
    /tmp/it-test --test-threads 1 --nocapture gpus::a_stage_records_what_its_gpu_did
  CI=true /tmp/it-test --test-threads 2 isolation::
} 2>&1 | tee "$out/tests.txt"

for isolation in auto off; do
  echo "== DRIVETRAIN_ISOLATION=$isolation"
  DRIVETRAIN_ISOLATION=$isolation python3 bench/bench.py --suite run --repeats 5 --binary "$built_with"
done 2>&1 | tee "$out/overhead.txt"
