#!/usr/bin/env python3
"""How long moving a process into a cgroup v1 takes here: what joining its cgroups costs
an attempt of the local executor (bench/README.md, "Containment").

Forks 30 children that sleep, writes each one's pid to `cgroup.procs` of a fresh cgroup
in the `pids` hierarchy, and prints the median and 90th percentile of the write. Needs
root and a v1 `pids` hierarchy at /sys/fs/cgroup/pids (the cgroup is removed after).
"""
import os
import sys
import time

HIERARCHY = sys.argv[1] if len(sys.argv) > 1 else "/sys/fs/cgroup/pids"
GROUP = os.path.join(HIERARCHY, f"drivetrain-bench-{os.getpid()}")


def main():
    os.mkdir(GROUP)
    took = []
    try:
        for _ in range(30):
            pid = os.fork()
            if pid == 0:
                time.sleep(0.05)
                os._exit(0)
            start = time.perf_counter()
            with open(os.path.join(GROUP, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            took.append(time.perf_counter() - start)
            os.waitpid(pid, 0)
    finally:
        os.rmdir(GROUP)
    took.sort()
    print(f"moving a process into a cgroup ({HIERARCHY}): median {took[len(took) // 2] * 1e6:.0f} µs, "
          f"p90 {took[int(len(took) * 0.9)] * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
