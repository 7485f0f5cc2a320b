#!/usr/bin/env python3
"""Benchmarks of drivetrain's validation and planning (see README.md here).

Generates a random DAG pipeline (default 10,000 stages, about 3 edges per stage),
then times whole commands of the release binary and reads each run's peak memory
from the kernel (wait4's ru_maxrss). Every figure is compared with a baseline measured
in the same run: `drivetrain --version` (process start, argument parsing, no work), and,
for the large pipeline, `yaml-scan` (the same YAML parser drivetrain uses, producing its
events and building nothing): the floor any validator built on that parser has.
Standard library only.
"""

import argparse
import atexit
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import statistics
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate(n, edges, seed):
    rng = random.Random(seed)
    out = [
        "version: 1",
        f"name: generated-{n}",
        "params:",
        "  day: {type: string, default: '2026-11-20'}",
        "  epochs: {type: integer, default: 3}",
        "defaults:",
        "  retries: {limit: 2, backoff: 5s}",
        "  timeout: 10m",
        "stages:",
    ]
    for i in range(n):
        name = f"s{i:05d}"
        out.append(f"  {name}:")
        k = min(i, rng.randint(max(0, edges - 2), edges + 2))
        ups = sorted(rng.sample(range(max(0, i - 500), i), k)) if k else []
        needs = [u for j, u in enumerate(ups) if j % 2 == 0]
        inputs = [u for j, u in enumerate(ups) if j % 2 == 1]
        if needs:
            out.append("    needs: [" + ", ".join(f"s{u:05d}" for u in needs) + "]")
        if inputs:
            out.append("    inputs:")
            for u in inputs:
                out.append(f"      in{u}: s{u:05d}.out")
        out.append("    run:")
        args = ["true", "--day", '"{{ params.day }}"', '"--epochs={{ params.epochs }}"', "--out", '"{{ outputs.out }}"']
        args += [f'"{{{{ inputs.in{u} }}}}"' for u in inputs]
        out.append("      command: [" + ", ".join(args) + "]")
        out.append("    resources: {cpu: 500m, memory: 1Gi}")
        out.append("    outputs: [out]")
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def until_exit():
    """A scratch directory removed when the benchmark exits rather than when its suite
    ends. On an ext4 without a journal (this project's test machines), inodes deleted in
    the last 5 minutes (300 s more while their inode-table block is dirty) are skipped
    one by one by every later `mkdir` and `create` (`recently_deleted`), so a suite's
    cleanup would slow the engine in the next suite but not its fork+exec floor."""
    path = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, path, True)
    # An isolated stage gets a /dev of its own, so the engine refuses a home under /dev
    # (bench/README.md, "Session 17"): every run would fail, and the figures with it.
    if os.path.realpath(path).startswith(("/dev/", "/proc/", "/sys/")):
        sys.exit(f"TMPDIR is under /dev ({path}): the engine refuses a home there for isolated "
                 "stages; mount a tmpfs elsewhere (mount -t tmpfs tmpfs /tmp/tmpfs) and use TMPDIR=/tmp/tmpfs")
    yield path


def measure_once(cmd):
    """Wall time and peak RSS of one run under GNU time (for runs that take minutes)."""
    gnu_time = ["/usr/bin/time", "-f", "%M"] if os.path.exists("/usr/bin/time") else []
    start = time.perf_counter()
    out = subprocess.run([*gnu_time, *cmd], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {out.returncode}")
    # Without GNU time (the GPU machine's image has none) there is no peak RSS.
    return wall, (int(out.stderr.strip().splitlines()[-1]) if gnu_time else 0)


def measure(cmd, repeats, ok=(0,)):
    """Median wall time and peak RSS of `cmd`.

    The peak RSS comes from GNU time (`/usr/bin/time -f %M`), whose child is a fork of a
    small C program; a child forked or vforked from this Python process would report
    Python's own resident pages as its peak. Without GNU time, RSS is not reported.
    """
    gnu_time = "/usr/bin/time" if os.path.exists("/usr/bin/time") else None
    walls, rss = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        walls.append(time.perf_counter() - start)
        if proc.returncode not in ok:
            sys.exit(f"{' '.join(cmd)} exited {proc.returncode}")
    if gnu_time:
        for _ in range(3):
            out = subprocess.run([gnu_time, "-f", "%M", *cmd], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            rss.append(int(out.stderr.strip().splitlines()[-1]))
    return statistics.median(walls), (max(rss) if rss else None)


def hostile_inputs():
    """The hostile pipelines of issue 16 at the largest sizes the tests use: (label, text)."""
    def when(expr):
        return ("version: 1\nname: hostile\nparams: {a: {type: boolean, default: true}}\nstages:\n"
                f"  s:\n    when: \"{expr}\"\n    run: {{command: [true]}}\n")
    bomb = ("version: 1\nname: x\nparams:\n  p: {default: &a " + "y" * 100_000 + "}\nstages:\n"
            "  s:\n    run: {command: [true]}\nx:\n" + "  - *a\n" * 20_000)
    laughs = "version: 1\nname: x\na0: &a0 [" + ", ".join(["lol"] * 10) + "]\n" + "".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 10))
    many = ("version: 1\nname: x\nstages:\n  s:\n    run: {command: [echo, "
            + ", ".join(f'"{{{{ params.x{i} }}}}"' for i in range(800)) + "]}\n")
    tail = "stages:\n  s:\n    run: {command: [true]}\n"
    return [
        ("when: 1,800 nested parentheses", when("(" * 1800 + "params.a" + ")" * 1800)),
        ("when: 20,000 `!`", when("!" * 20_000 + "params.a")),
        ("when: 40,000 conditions joined by && (valid)", when(" && ".join(["params.a"] * 40_000))),
        ("100 KB scalar aliased 20,000 times (2 GB expanded)", bomb),
        ("nine levels of ten aliases (a billion laughs)", laughs),
        ("800 unknown params on one line", many),
        ("when: 80,000 unknown params joined by &&", when(" && ".join(f"params.x{i}" for i in range(80_000)))),
        ("a 10 MB key", "version: 1\nname: x\n" + "k" * (10 << 20) + ": 1\n" + tail),
        ("a 30 MB description (valid)", "version: 1\nname: x\ndescription: " + "d" * (30 << 20) + "\n" + tail),
        ("100,000 nested flow sequences", "version: 1\nname: " + "[" * 100_000 + "]" * 100_000 + "\n"),
    ]


def hostile(binary, repeats):
    """`validate` of each hostile input: exit code, output size, median wall, peak RSS, and
    the ratio to validating driving-loop.yaml in the same invocation."""
    loop = os.path.join(ROOT, "pipelines", "driving-loop.yaml")
    base_wall, base_rss = measure([binary, "validate", loop], repeats)
    print(f"\n| input | size | exit | output | median wall | ÷ driving-loop | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| baseline: driving-loop.yaml | {os.path.getsize(loop) / 1024:.1f} KiB | 0 | | "
          f"{base_wall * 1000:.1f} ms | 1.0× | {base_rss / 1024:.1f} MiB |")
    with tempfile.TemporaryDirectory() as tmp:
        for label, text in hostile_inputs():
            path = os.path.join(tmp, "h.yaml")
            with open(path, "w") as f:
                f.write(text)
            cmd = [binary, "validate", path]
            out = subprocess.run(cmd, capture_output=True)
            wall, rss = measure(cmd, repeats, ok=(0, 1))
            size = len(text.encode())
            shown = f"{size / 1024 / 1024:.1f} MiB" if size > 1 << 20 else f"{size / 1024:.1f} KiB"
            print(f"| {label} | {shown} | {out.returncode} | {len(out.stdout) + len(out.stderr)} B | "
                  f"{wall * 1000:.1f} ms | {wall / base_wall:.1f}× | {rss / 1024:.1f} MiB |")


def run_pipeline(n, wide):
    lines = ["version: 1", f"name: {'wide' if wide else 'chain'}-{n}", "stages:"]
    for i in range(n):
        lines.append(f"  s{i:04d}:")
        if i > 0 and not wide:
            lines.append(f"    needs: [s{i - 1:04d}]")
        lines.append("    run: {command: [/bin/true]}")
    return "\n".join(lines) + "\n"


def engine_overhead(binary, repeats, stages=100):
    """Engine overhead per stage: `drivetrain run` of a 100-stage chain and a 100-wide
    fan-out of `true`, minus 100 fork+execs of `true` by a shell, in the same run."""
    with until_exit() as tmp:
        chain = os.path.join(tmp, "chain.yaml")
        wide = os.path.join(tmp, "wide.yaml")
        with open(chain, "w") as f:
            f.write(run_pipeline(stages, wide=False))
        with open(wide, "w") as f:
            f.write(run_pipeline(stages, wide=True))
        home = os.path.join(tmp, "home")
        base = measure(["sh", "-c", f"for i in $(seq {stages}); do /bin/true; done"], repeats)
        rows = [(f"baseline: {stages} × fork+exec of true (sh loop)", base)]
        for label, path, par, isolation in [
            (f"run {stages}-stage chain", chain, "1", "auto"),
            (f"run {stages}-wide fan-out (--parallelism 2)", wide, "2", "auto"),
            (f"run {stages}-stage chain, no mount namespace", chain, "1", "off"),
        ]:
            cmd = ["env", f"DRIVETRAIN_ISOLATION={isolation}", binary, "--home", home, "run", path,
                   "--parallelism", par]
            rows.append((label, measure(cmd, repeats)))
        print(f"\n| command | median wall | peak RSS | engine overhead per stage |")
        print("|---|---:|---:|---:|")
        for label, (wall, rss) in rows:
            per = "" if label.startswith("baseline") else f"{(wall - base[0]) / stages * 1000:.2f} ms"
            shown = f"{rss / 1024:.1f} MiB" if rss else "n/a"
            print(f"| {label} | {wall * 1000:.1f} ms | {shown} | {per} |")



def scratch_root():
    """`target/` of the checkout, made if a CARGO_TARGET_DIR elsewhere left it absent: the
    suites that write homes of many runs write them there, on disk."""
    path = os.path.join(ROOT, "target")
    os.makedirs(path, exist_ok=True)
    return path

def fanout(binary, repeats, stages=1000, pars=(2, 16)):
    """A 1,000-wide fan-out of `true` at --parallelism P against `xargs -P P` running the
    same 1,000 `true`s (the fork+exec floor at that parallelism), in the same run."""
    with until_exit() as tmp:
        wide = os.path.join(tmp, "wide.yaml")
        with open(wide, "w") as f:
            f.write(run_pipeline(stages, wide=True))
        print(f"\n| {stages}-wide fan-out of true | median wall | floor: xargs -P | engine overhead per stage | peak RSS |")
        print("|---|---:|---:|---:|---:|")
        for par in pars:
            home = os.path.join(tmp, f"home-{par}")
            engine = [binary, "--home", home, "run", wide, "--parallelism", str(par)]
            floor_cmd = ["sh", "-c", f"seq {stages} | xargs -P {par} -n 1 /bin/true"]
            # A first run makes the home; then floor and engine take turns, so a noisy
            # neighbour slows both alike.
            rss = measure_once(engine)[1]
            floors, walls = [], []
            for _ in range(repeats):
                floors.append(measure_once(floor_cmd)[0])
                walls.append(measure_once(engine)[0])
            floor, wall = statistics.median(floors), statistics.median(walls)
            print(f"| --parallelism {par} | {wall * 1000:.0f} ms | {floor * 1000:.0f} ms | "
                  f"{(wall - floor) / stages * 1000:.2f} ms | "
                  f"{f'{rss / 1024:.1f} MiB' if rss else 'n/a'} |")


def passthrough(binary, repeats, mib, stages=10):
    """Artifact pass-through on `file://`: stage 0 writes `mib` MiB, each next stage copies
    its input to its output (`cp`); baseline: the same `head` and `cp`s in a shell script.
    The engine's own part (publishing, materializing) is hard links: throughput ratio ≈ 1."""
    lines = ["version: 1", "name: passthrough", "stages:",
             "  s0:",
             f"    run: {{command: [sh, -c, 'head -c {mib}M /dev/zero > \"$0/data\"', \"{{{{ outputs.data }}}}\"]}}",
             "    outputs: [data]"]
    for i in range(1, stages):
        lines += [f"  s{i}:",
                  f"    inputs: {{data: s{i - 1}.data}}",
                  f"    run: {{command: [cp, \"{{{{ inputs.data }}}}/data\", \"{{{{ outputs.data }}}}/data\"]}}",
                  "    outputs: [data]"]
    with tempfile.TemporaryDirectory(dir=scratch_root()) as tmp:
        path = os.path.join(tmp, "pass.yaml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        script = f"cd {tmp} && head -c {mib}M /dev/zero > d0"
        for i in range(1, stages):
            script += f" && cp d{i - 1} d{i}"
        script += " && rm -f d*"
        base = measure(["sh", "-c", script], repeats)
        home = os.path.join(tmp, "home")
        runs = measure(["sh", "-c", f"rm -rf {home} && {binary} --home {home} run {path} > /dev/null"], repeats)
        total = mib * stages
        print(f"\n| {stages} stages × {mib} MiB | median wall | throughput | ratio to baseline |")
        print("|---|---:|---:|---:|")
        print(f"| baseline: head + {stages - 1} × cp (sh) | {base[0] * 1000:.0f} ms | {total / base[0]:.0f} MiB/s | 1.00 |")
        print(f"| drivetrain run | {runs[0] * 1000:.0f} ms | {total / runs[0]:.0f} MiB/s | {base[0] / runs[0]:.2f} |")


def scale(binary, items=100_000, stages=10_000):
    """A `items`-item map, a `stages`-stage chain and a `stages`-wide fan-out of
    `/bin/true`: each completes; peak memory of the engine and wall time (one run each:
    they take minutes); then how long `status`, `list` and the web view's API take to
    answer about each run."""
    with tempfile.TemporaryDirectory(dir=scratch_root()) as tmp:
        m = os.path.join(tmp, "map.yaml")
        with open(m, "w") as f:
            f.write(
                "version: 1\nname: bigmap\nstages:\n  list:\n"
                f"    run: {{command: [python3, -c, 'import json,sys; json.dump(list(range({items})), open(sys.argv[1] + \"/items.json\", \"w\"))', \"{{{{ outputs.items }}}}\"]}}\n"
                "    outputs: [items]\n  each:\n    map: {from: list.items}\n    run: {command: [/bin/true]}\n"
            )
        c = os.path.join(tmp, "chain.yaml")
        with open(c, "w") as f:
            f.write(run_pipeline(stages, wide=False))
        w = os.path.join(tmp, "wide.yaml")
        with open(w, "w") as f:
            f.write(run_pipeline(stages, wide=True))
        print(f"\n| run | validate | plan | run: wall | run: engine peak RSS |")
        print("|---|---:|---:|---:|---:|")
        homes = []
        for label, path, stage in [(f"{stages}-stage chain of true", c, "s0000"),
                                   (f"{stages}-wide fan-out of true", w, "s0000"),
                                   (f"{items}-item map of true", m, "each")]:
            home = os.path.join(tmp, "home-" + os.path.basename(path))
            val = measure_once([binary, "validate", path])
            plan = measure_once([binary, "plan", path])
            wall, rss = measure_once([binary, "--home", home, "run", path, "--parallelism", "2"])
            shown = f"{rss / 1024:.1f} MiB" if rss else "n/a"
            print(f"| {label} (--parallelism 2) | {val[0]:.2f} s | {plan[0]:.2f} s | {wall:.1f} s | {shown} |",
                  flush=True)
            homes.append((label, home, stage))
        for label, home, stage in homes:
            answers(binary, label, home, stage)


def answers(binary, label, home, stage):
    """How long `status`, `list` and the API a run page reads take to answer about the
    one run in `home` (median of 3, `drivetrain ui` on loopback, no token: it reads)."""
    run = subprocess.run([binary, "--home", home, "list", "--output", "json"],
                         capture_output=True, text=True, check=True)
    run_id = json.loads(run.stdout)[0]["id"]
    rows = [("status", [binary, "--home", home, "status", run_id]),
            ("list", [binary, "--home", home, "list"])]
    print(f"\n{label}: what reads of it take (median of 3)\n")
    print("| read | wall |")
    print("|---|---:|")
    for name, cmd in rows:
        print(f"| `drivetrain {name}` | {measure(cmd, 3)[0] * 1000:.0f} ms |")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ui = subprocess.Popen([binary, "--home", home, "ui", "--bind", f"127.0.0.1:{port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        for path in [f"/api/v1/runs/{run_id}", f"/api/v1/runs/{run_id}/graph",
                     f"/api/v1/runs/{run_id}/attempts",
                     f"/api/v1/runs/{run_id}/stages/{stage}/items?limit=100", "/api/v1/runs"]:
            walls, size = [], 0
            for _ in range(3):
                start = time.perf_counter()
                try:
                    with urllib.request.urlopen(base + path, timeout=120) as r:
                        size = len(r.read())
                except OSError as e:
                    size = f"error: {e}"
                walls.append(time.perf_counter() - start)
                # One answer over 10 s (or none) says enough; asking again only waits.
                if walls[-1] > 10 or not isinstance(size, int):
                    break
            shown = (size if not isinstance(size, int) else
                     f"{size} B" if size < 10240 else f"{size / 1024:.0f} KiB")
            print(f"| GET {path.replace(run_id, '{id}')} ({shown}) | {statistics.median(walls) * 1000:.0f} ms |")
    finally:
        ui.terminate()
        ui.wait()


def output_chain(n):
    """An `n`-stage chain whose stages each write a small output the next one reads."""
    lines = [f"version: 1", f"name: cached-{n}", "stages:"]
    for i in range(n):
        lines.append(f"  s{i:04d}:")
        if i > 0:
            lines.append(f"    inputs: {{i: s{i - 1:04d}.o}}")
        lines.append(f"    run: {{command: [sh, -c, 'echo {i} > \"$0/f\"', \"{{{{ outputs.o }}}}\"]}}")
        lines.append("    outputs: [o]")
    return "\n".join(lines) + "\n"


def cache_and_lineage(binary, repeats, stages=1000, depth=100):
    """A fully cached run of a `stages`-stage chain (every stage a hit), against the same
    binary validating the file and the first, uncached run; and `lineage` of the last
    artifact of a `depth`-stage chain, against `drivetrain list` on the same home."""
    with tempfile.TemporaryDirectory(dir=scratch_root()) as tmp:
        path = os.path.join(tmp, "chain.yaml")
        with open(path, "w") as f:
            f.write(output_chain(stages))
        home = os.path.join(tmp, "home")
        first, _ = measure_once([binary, "--home", home, "run", path])
        validate = measure([binary, "validate", path], repeats)
        cached = measure([binary, "--home", home, "run", path], repeats)
        print(f"\n| {stages}-stage chain with outputs | median wall | peak RSS | ratio |")
        print("|---|---:|---:|---:|")
        print(f"| first run (every stage executes), once | {first * 1000:.0f} ms | | 1.00 |")
        print(f"| validate the file | {validate[0] * 1000:.0f} ms | {validate[1] / 1024:.1f} MiB | {validate[0] / first:.3f} |")
        print(f"| fully cached run | {cached[0] * 1000:.0f} ms | {cached[1] / 1024:.1f} MiB | {cached[0] / first:.3f} |")

        deep = os.path.join(tmp, "deep.yaml")
        with open(deep, "w") as f:
            f.write(output_chain(depth))
        dhome = os.path.join(tmp, "deep-home")
        out = subprocess.run([binary, "--home", dhome, "run", deep], capture_output=True, text=True)
        run = out.stdout.splitlines()[0].split()[1]
        target = f"{run}/s{depth - 1:04d}/o"
        base = measure([binary, "--home", dhome, "list"], repeats)
        lin = measure([binary, "--home", dhome, "lineage", target, "--output", "json"], repeats)
        print(f"\n| lineage {depth} stages deep | median wall |")
        print("|---|---:|")
        print(f"| baseline: drivetrain list (start, open the state) | {base[0] * 1000:.1f} ms |")
        print(f"| lineage RUN/s{depth - 1:04d}/o --output json | {lin[0] * 1000:.1f} ms |")
        print(f"| lineage minus baseline | {(lin[0] - base[0]) * 1000:.1f} ms |")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stages", type=int, default=10_000)
    ap.add_argument("--edges", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--suite", choices=["all", "validate", "run", "artifacts", "scale", "cache", "hostile"], default="all")
    ap.add_argument("--mib", type=int, default=1024, help="artifact size for --suite artifacts")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "drivetrain"))
    ap.add_argument("--scale-items", type=int, default=100_000, help="items of --suite scale's map")
    ap.add_argument("--scale-stages", type=int, default=10_000, help="stages of --suite scale's chain")
    args = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR")
    if target and args.binary.startswith(os.path.join(ROOT, "target")):
        args.binary = os.path.join(target, "release", "drivetrain")
    scan = os.path.join(os.path.dirname(args.binary), "yaml-scan")
    # yaml-scan is the validate suite's baseline; the others need the engine only.
    for b in (args.binary, scan) if args.suite in ("all", "validate") else (args.binary,):
        if not os.path.exists(b):
            sys.exit(f"build first: cargo build --release --workspace ({b} missing)")

    if args.suite in ("all", "run"):
        engine_overhead(args.binary, args.repeats)
        fanout(args.binary, min(args.repeats, 5))
    if args.suite in ("all", "artifacts"):
        passthrough(args.binary, min(args.repeats, 3), args.mib)
    if args.suite in ("all", "cache"):
        cache_and_lineage(args.binary, args.repeats)
    if args.suite in ("all", "scale"):
        scale(args.binary, args.scale_items, args.scale_stages)
    if args.suite in ("all", "hostile"):
        hostile(args.binary, min(args.repeats, 5))
    if args.suite in ("run", "artifacts", "scale", "cache", "hostile"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        big = os.path.join(tmp, "big.yaml")
        text = generate(args.stages, args.edges, args.seed)
        with open(big, "w") as f:
            f.write(text)
        edges = text.count(".out\n") + sum(
            line.count(",") + 1 for line in text.splitlines() if line.startswith("    needs: [")
        )
        print(f"pipeline: {args.stages} stages, {edges} edges ({edges / args.stages:.2f} per stage), "
              f"{len(text) / 1024 / 1024:.1f} MiB of YAML")
        loop = os.path.join(ROOT, "pipelines", "driving-loop.yaml")
        cases = [
            ("baseline: drivetrain --version", [args.binary, "--version"]),
            ("validate driving-loop.yaml (8 stages)", [args.binary, "validate", loop]),
            (f"yaml-scan {args.stages} stages (saphyr-parser events only)", [scan, big]),
            (f"validate {args.stages} stages", [args.binary, "validate", big]),
            (f"plan {args.stages} stages", [args.binary, "plan", big]),
            (f"graph {args.stages} stages (mermaid)", [args.binary, "graph", big]),
        ]
        results = []
        for label, cmd in cases:
            wall, rss = measure(cmd, args.repeats)
            results.append((label, wall, rss))
        base = results[0][1]
        scan_wall = results[2][1]
        print("\n| command | median wall | ÷ --version | ÷ yaml-scan | peak RSS |")
        print("|---|---:|---:|---:|---:|")
        for label, wall, rss in results:
            shown = f"{rss / 1024:.1f} MiB" if rss else "n/a"
            print(f"| {label} | {wall * 1000:.1f} ms | {wall / base:.1f}× | {wall / scan_wall:.2f}× | {shown} |")


if __name__ == "__main__":
    main()
