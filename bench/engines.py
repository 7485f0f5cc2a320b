#!/usr/bin/env python3
"""drivetrain against other engines on the same DAGs of `/bin/true`, in one run.

Two DAGs, every task `/bin/true`:
- a chain of N stages (each needs the one before);
- a fan-out of N + 2 stages: a root, N stages after it, a sink after all of them.

Each is run, interleaved round by round so a noisy neighbour slows all alike, by:
- the floor: a shell loop of N + 0 `true`s (chain), `xargs -P 2` of N + 2 (fan-out);
- drivetrain (`run --parallelism 2`, a fresh home each run: every stage executed, none
  cached, full containment where the machine has it);
- Luigi (local scheduler, 2 workers; each task runs `true` and touches its marker file,
  which is how Luigi knows a task is done);
- HyperQueue (its Python API's LocalCluster, one worker of 2 cores, started once; the
  time is from submitting the job to its end: the server is not restarted per run).

Luigi and HyperQueue come from PyPI into a venv of their own (made with uv when there is
one, else pip) under ~/.cache/drivetrain/engines-venv; this script re-runs itself there.
The figures are per stage: (median wall) / stages, and each engine's ratio to drivetrain.

    python3 bench/engines.py [--binary target/release/drivetrain] [--stages 100] [--repeats 5]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.expanduser("~/.cache/drivetrain/engines-venv")
PINS = ["luigi==3.8.1", "hyperqueue==0.27.0"]


# HyperQueue's client draws a progress bar (tqdm) per job.
os.environ.setdefault("TQDM_DISABLE", "1")


def ensure_venv():
    """Runs this script again inside the venv holding Luigi and HyperQueue."""
    py = os.path.join(VENV, "bin", "python")
    if sys.prefix == VENV:
        return
    check = [py, "-c", "import luigi, hyperqueue"]
    if not os.path.exists(py) or subprocess.run(check, capture_output=True).returncode != 0:
        uv = os.path.expanduser("~/.cache/drivetrain/uv/bin/uv")
        if os.path.exists(uv):
            subprocess.run([uv, "venv", "-q", "--python", "python3", VENV], check=True)
            subprocess.run([uv, "pip", "install", "-q", "--python", py, *PINS], check=True)
        else:
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
            subprocess.run([py, "-m", "pip", "install", "-q", *PINS], check=True)
    os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])


def pipeline(n, wide):
    """drivetrain's YAML of the chain (bench.py's) or the fan-out."""
    if not wide:
        from bench import run_pipeline
        return run_pipeline(n, wide=False)
    lines = ["version: 1", f"name: fanout-{n}", "stages:"]
    lines += ["  root:", "    run: {command: [/bin/true]}"]
    for i in range(n):
        lines += [f"  s{i:04d}:", "    needs: [root]", "    run: {command: [/bin/true]}"]
    lines += ["  sink:", f"    needs: [{', '.join(f's{i:04d}' for i in range(n))}]",
              "    run: {command: [/bin/true]}"]
    return "\n".join(lines) + "\n"


def timed(cmd, **kw):
    start = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.decode()[-2000:]}")
    return wall


LUIGI = r'''
import os, subprocess, sys, luigi

N, WIDE, OUT = int(sys.argv[1]), sys.argv[2] == "wide", sys.argv[3]

class T(luigi.Task):
    name = luigi.Parameter()

    def requires(self):
        if WIDE:
            if self.name == "sink":
                return [T(name=f"s{i}") for i in range(N)]
            return [] if self.name == "root" else [T(name="root")]
        i = int(self.name[1:])
        return [T(name=f"s{i - 1}")] if i > 0 else []

    def output(self):
        return luigi.LocalTarget(os.path.join(OUT, self.name))

    def run(self):
        subprocess.run(["/bin/true"], check=True)
        with self.output().open("w"):
            pass

last = "sink" if WIDE else f"s{N - 1}"
ok = luigi.build([T(name=last)], local_scheduler=True, workers=2, log_level="ERROR")
sys.exit(0 if ok else 1)
'''


def luigi_run(n, wide, tmp):
    out = tempfile.mkdtemp(dir=tmp)
    script = os.path.join(tmp, "luigi_dag.py")
    if not os.path.exists(script):
        with open(script, "w") as f:
            f.write(LUIGI)
    return timed([sys.executable, script, str(n), "wide" if wide else "chain", out])


class Hq:
    """A HyperQueue server and one 2-core worker, started once."""

    def __init__(self, tmp):
        from hyperqueue import LocalCluster
        from hyperqueue.cluster import WorkerConfig
        self.cluster = LocalCluster(server_dir=tmp, worker_config=WorkerConfig(cores=2))
        self.client = self.cluster.client()

    def run(self, n, wide):
        from hyperqueue import Job
        job = Job()
        if wide:
            root = job.program(["/bin/true"], stdout=None, stderr=None)
            mid = [job.program(["/bin/true"], deps=[root], stdout=None, stderr=None)
                   for _ in range(n)]
            job.program(["/bin/true"], deps=mid, stdout=None, stderr=None)
        else:
            prev = []
            for _ in range(n):
                prev = [job.program(["/bin/true"], deps=prev, stdout=None, stderr=None)]
        start = time.perf_counter()
        submitted = self.client.submit(job)
        if not self.client.wait_for_jobs([submitted], raise_on_error=True):
            sys.exit("HyperQueue: the job failed")
        return time.perf_counter() - start

    def stop(self):
        self.cluster.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "drivetrain"))
    ap.add_argument("--stages", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    if not os.path.exists(a.binary):
        sys.exit(f"no {a.binary}: cargo build --release first, or give --binary")
    ensure_venv()
    n = a.stages
    tmp = tempfile.mkdtemp(prefix="dt-engines-")
    files = {}
    for shape, wide in [("chain", False), ("fanout", True)]:
        files[shape] = os.path.join(tmp, f"{shape}.yaml")
        with open(files[shape], "w") as f:
            f.write(pipeline(n, wide))
    count = {"chain": n, "fanout": n + 2}
    floors = {
        "chain": ["sh", "-c", f"for i in $(seq {n}); do /bin/true; done"],
        "fanout": ["sh", "-c", f"seq {n + 2} | xargs -P 2 -n 1 /bin/true"],
    }
    hq = Hq(os.path.join(tmp, "hq"))
    walls = {(e, s): [] for e in ("floor", "drivetrain", "luigi", "hyperqueue") for s in files}
    runs = 0
    try:
        for _ in range(a.repeats):
            for shape, wide in [("chain", False), ("fanout", True)]:
                runs += 1
                home = os.path.join(tmp, f"home-{runs}")
                walls[("floor", shape)].append(timed(floors[shape]))
                walls[("drivetrain", shape)].append(timed(
                    [a.binary, "--home", home, "run", files[shape], "--parallelism", "2"]))
                walls[("luigi", shape)].append(luigi_run(n, wide, tmp))
                walls[("hyperqueue", shape)].append(hq.run(n, wide))
    finally:
        hq.stop()
        subprocess.run(["rm", "-rf", tmp])
    per = {k: statistics.median(v) / count[k[1]] * 1000 for k, v in walls.items()}
    print(f"\n{n}-stage chain and {n + 2}-stage fan-out of /bin/true, 2 at a time, "
          f"median of {a.repeats} interleaved rounds, ms per stage:\n")
    print("| engine | chain | fan-out | chain ÷ drivetrain | fan-out ÷ drivetrain |")
    print("|---|---:|---:|---:|---:|")
    for e in ("floor", "drivetrain", "luigi", "hyperqueue"):
        c, f = per[(e, "chain")], per[(e, "fanout")]
        dc, df = per[("drivetrain", "chain")], per[("drivetrain", "fanout")]
        print(f"| {e} | {c:.2f} | {f:.2f} | {c / dc:.2f}× | {f / df:.2f}× |")
    dc = per[("drivetrain", "chain")] - per[("floor", "chain")]
    df = per[("drivetrain", "fanout")] - per[("floor", "fanout")]
    print(f"\ndrivetrain over the floor: {dc:.2f} ms a stage (chain), {df:.2f} ms (fan-out)")


if __name__ == "__main__":
    main()
