#!/usr/bin/env bash
# Runs `$DRIVETRAIN_BIN ARGS` in a cgroup v2 of its own, as a systemd unit with
# `Delegate=yes` would start the engine: a new cgroup under `$DRIVETRAIN_CGROUP_PARENT`
# (whose `cgroup.subtree_control` hands out memory, pids and cpu), removed when the engine
# has ended. Where that cannot be made (not root, inside another user namespace), the
# engine runs where this script runs.
#
# bench/gpu_machine.sh puts it where the test binary looks for `drivetrain`, so the
# benchmarks and tests on a cgroup v2 host run the engine as it is deployed there.
set -u
parent=${DRIVETRAIN_CGROUP_PARENT:-}
leaf=$parent/engine.$$
if [ -n "$parent" ] && mkdir "$leaf" 2>/dev/null; then
  (echo "$BASHPID" >"$leaf/cgroup.procs" && exec "$DRIVETRAIN_BIN" "$@")
  status=$?
  find "$leaf" -depth -type d -exec rmdir {} + 2>/dev/null
  exit $status
fi
exec "$DRIVETRAIN_BIN" "$@"
