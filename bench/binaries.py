#!/usr/bin/env python3
"""What the binaries cost to copy and to start (bench/README.md, "The binaries").

For each binary given: its size, its gzip size (what a registry stores), and the median
wall time and minor page faults of `BINARY --version` over --repeats runs, interleaved
with `/bin/true` (process start and nothing else) in the same loop, so a noisy machine
moves both alike. Standard library only.

    python3 bench/binaries.py target/release/drivetrain target/release/drivetrain-exec
"""

import argparse
import gzip
import os
import resource
import subprocess
import time


def one(argv):
    """Wall seconds and minor faults of one run of argv."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    t = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before


def gzip_size(path):
    with open(path, "rb") as f:
        return len(gzip.compress(f.read(), compresslevel=6))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    commands = [("/bin/true", ["/bin/true"])] + [
        (os.path.basename(b) + " --version", [b, "--version"]) for b in args.binaries
    ]
    walls = {name: [] for name, _ in commands}
    faults = {name: [] for name, _ in commands}
    for argv in (c for _, c in commands):
        one(argv)  # the page cache holds every binary before the first timed run
    for _ in range(args.repeats):
        for name, argv in commands:
            w, f = one(argv)
            walls[name].append(w)
            faults[name].append(f)
    print("| binary | size | gzip | command | median wall | minus /bin/true | minor faults |")
    print("|---|---:|---:|---|---:|---:|---:|")
    floor = median(walls["/bin/true"])
    for (name, argv) in commands:
        path = argv[0]
        size = os.path.getsize(path) / 1e6
        gz = gzip_size(path) / 1e6
        m = median(walls[name])
        print(
            f"| {path} | {size:.1f} MB | {gz:.1f} MB | `{name}` | {m * 1e3:.2f} ms "
            f"| {(m - floor) * 1e3:.2f} ms | {median(faults[name])} |"
        )


if __name__ == "__main__":
    main()
