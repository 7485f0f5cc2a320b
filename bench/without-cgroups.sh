#!/bin/sh
# Runs the drivetrain binary named by DRIVETRAIN_BIN with the host's cgroups hidden (a
# tmpfs over /sys/fs/cgroup in a mount namespace of its own): `bench.py --binary
# bench/without-cgroups.sh` measures the containment layers without the cgroups (needs
# root; see bench/README.md, "Containment").
exec unshare -m sh -c 'mount -t tmpfs none /sys/fs/cgroup && exec "$DRIVETRAIN_BIN" "$@"' sh "$@"
