#!/usr/bin/env python3
"""Where a fan-out's CPU time goes, by process: `perf record -a -g` of a 1,000-wide fan-out
of `true` at `--parallelism P` (after a first run that makes the home), then every sample
put with one of: the engine (its own pid), an attempt's process before it execs (a child
of the engine still named like the engine's threads), a sandbox's init (`exe`: the
engine binary run through /proc/self/exe), `true` itself, and the rest; within the first
three, the system call (or kernel entry) each sample was in. Shares of all samples
(bench/README.md, "Session 17"). Needs perf and root; set TMPDIR to a tmpfs that is not
under /dev.

Usage: python3 bench/profile_by_process.py BINARY [P]
"""
import collections
import os
import subprocess
import sys
import tempfile

ROWS = 12


def fanout_yaml(path, stages=1000):
    lines = ["version: 1", "name: wide", "stages:"]
    for i in range(stages):
        lines += [f"  s{i:04d}:", "    run: {command: [/bin/true]}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def samples(script):
    """(comm, pid, frames leaf first) of each sample of `perf script -F comm,pid,ip,sym`."""
    head, frames = None, []
    for line in script.splitlines():
        if not line.strip():
            if head:
                yield head[0], head[1], frames
            head, frames = None, []
        elif not line[0].isspace():
            parts = line.split()
            head, frames = (parts[0], parts[1]), []
        else:
            parts = line.split(None, 1)
            frames.append(parts[1] if len(parts) > 1 else "?")
    if head:
        yield head[0], head[1], frames


def entry(frames):
    """The system call a sample was in, or its leaf."""
    for f in frames:
        name = f.split()[-1]
        if name.startswith("__x64_sys_") or name == "do_seccomp":
            return name
    for f in frames:
        if "page_fault" in f:
            return "page faults"
    return frames[0].split()[-1] if frames else "?"


def main():
    binary, par = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "2"
    with tempfile.TemporaryDirectory() as tmp:
        if os.path.realpath(tmp).startswith(("/dev/", "/proc/", "/sys/")):
            sys.exit(f"TMPDIR is under /dev ({tmp}): use a tmpfs elsewhere")
        wide = os.path.join(tmp, "wide.yaml")
        fanout_yaml(wide)
        run = [binary, "--home", os.path.join(tmp, "warm"), "run", wide, "--parallelism", par]
        subprocess.run(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        data = os.path.join(tmp, "perf.data")
        engine = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-g", "-o", data, "--", binary, "--home",
             os.path.join(tmp, "home"), "run", wide, "--parallelism", par],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        engine.wait()
        script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,ip,sym"],
                                capture_output=True, text=True).stdout
    all_samples = list(samples(script))
    total = len(all_samples)
    # The engine: the process with the most samples among those named like its threads.
    worker = collections.Counter(p for c, p, _ in all_samples if c == "tokio-rt-worker")
    engine_pid = worker.most_common(1)[0][0]
    groups = collections.defaultdict(list)
    for comm, pid, frames in all_samples:
        if comm in ("tokio-rt-worker", os.path.basename(binary)) and pid == engine_pid:
            groups["the engine"].append(frames)
        elif comm == "tokio-rt-worker":
            groups["an attempt's process before exec"].append(frames)
        elif comm == "exe":
            groups["a sandbox's init"].append(frames)
        elif comm == "true":
            groups["true"].append(frames)
        else:
            groups["the rest (idle, kernel threads)"].append(frames)
    print(f"{total} samples")
    for name in ("the engine", "an attempt's process before exec", "a sandbox's init",
                 "true", "the rest (idle, kernel threads)"):
        got = groups[name]
        print(f"\n{name}: {100 * len(got) / total:.2f} %")
        if name in ("true", "the rest (idle, kernel threads)"):
            continue
        for what, n in collections.Counter(entry(f) for f in got).most_common(ROWS):
            print(f"  {100 * n / total:5.2f} %  {what}")


if __name__ == "__main__":
    main()
