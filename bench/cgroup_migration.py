#!/usr/bin/env python3
"""How long moving a process into a cgroup v1 takes here: what joining its cgroups costs
an attempt of the local executor (bench/README.md, "Containment").

Two ways, 30 forks each, with a 50 ms pause between moves (as between bursts of stages):
- `procs`: the parent writes the child's pid to `cgroup.procs` of a fresh cgroup. That is
  a thread-group migration: the kernel takes the global `cgroup_threadgroup_rwsem` for
  writing, which waits out an RCU grace period.
- `self-tasks`: the child writes `0` to `tasks`, moving only its own (single) thread,
  which the kernel does without that lock. This is what the engine's child does.

Prints the median and 90th percentile of each write. Needs root and a v1 hierarchy at
the path given (default /sys/fs/cgroup/pids); the cgroup is removed after.
"""
import os
import sys
import time

HIERARCHY = sys.argv[1] if len(sys.argv) > 1 else "/sys/fs/cgroup/pids"
GROUP = os.path.join(HIERARCHY, f"drivetrain-bench-{os.getpid()}")


def by_parent():
    pid = os.fork()
    if pid == 0:
        time.sleep(0.05)
        os._exit(0)
    start = time.perf_counter()
    with open(os.path.join(GROUP, "cgroup.procs"), "w") as f:
        f.write(str(pid))
    took = time.perf_counter() - start
    os.waitpid(pid, 0)
    return took


def by_itself():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        start = time.perf_counter()
        fd = os.open(os.path.join(GROUP, "tasks"), os.O_WRONLY)
        os.write(fd, b"0")
        os.write(w, repr(time.perf_counter() - start).encode())
        os._exit(0)
    os.close(w)
    took = float(os.read(r, 64))
    os.close(r)
    os.waitpid(pid, 0)
    time.sleep(0.05)
    return took


def main():
    os.mkdir(GROUP)
    try:
        for name, move in (("procs", by_parent), ("self-tasks", by_itself)):
            took = sorted(move() for _ in range(30))
            print(f"moving a process into a cgroup ({HIERARCHY}, {name}): "
                  f"median {took[len(took) // 2] * 1e6:.0f} µs, p90 {took[int(len(took) * 0.9)] * 1e6:.0f} µs")
    finally:
        os.rmdir(GROUP)


if __name__ == "__main__":
    main()
