#!/usr/bin/env python3
"""What the slurm executor adds per stage (see README.md here, "Slurm").

A real single-node Slurm (tests/slurm/cluster.sh: munge, slurmctld, slurmd on loopback,
under a temporary directory), measured in the same run, round after round:
  - `sbatch`: a bare `sbatch --wait` of the stage's command (`true`), one job after the
    other: the baseline, what a user's own script pays for the same job;
  - `floor`: `sbatch` of the same command, then `squeue` every 20 ms until the job is
    COMPLETED: the least any client of this cluster waits for the job (Slurm's own
    scheduling, launch and completion);
  - `drivetrain`: `drivetrain run --executor slurm` of a chain of `--stages` stages, each
    that same command: per stage, the run's wall time divided by its stages (the engine's
    start, its SQLite records, the attempt's directory, sbatch, the batched squeue poll,
    the log and outputs published).
And a map (`--items` items of `true`, `max_parallel` unset) on the same cluster: one
job array through drivetrain against a bare `sbatch --wait --array=0-N` of the same
command. The figure is the median over rounds of each, and their ratio.

  cargo build --release --bin drivetrain
  python3 bench/slurm.py [--stages 10] [--items 100] [--rounds 3] [--poll 500ms]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BIN = os.path.join(TARGET, "release", "drivetrain")
CLUSTER = os.path.join(ROOT, "tests", "slurm", "cluster.sh")


def chain(n):
    lines = ["version: 1", "name: slurm-chain", "stages:"]
    for i in range(n):
        lines.append(f"  s{i}:")
        if i:
            lines.append(f"    needs: [s{i - 1}]")
        lines.append("    run: {command: [\"true\"]}")
    return "\n".join(lines) + "\n"


def fan(n):
    items = ", ".join(str(i) for i in range(n))
    return ("version: 1\nname: slurm-map\nstages:\n  each:\n"
            f"    map: {{items: [{items}]}}\n    run: {{command: [\"true\"]}}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=10)
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--poll", default="500ms")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="bench-slurm-")
    cluster = os.path.join(d, "cluster")
    subprocess.run(["bash", CLUSTER, "start", cluster], check=True, stdout=subprocess.DEVNULL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRIVETRAIN_")}
    env["SLURM_CONF"] = os.path.join(cluster, "slurm.conf")
    settings = os.path.join(d, "slurm.yaml")
    with open(settings, "w") as f:
        f.write(f"poll_interval: {args.poll}\n")
    env["DRIVETRAIN_SLURM"] = settings
    pipeline = os.path.join(d, "chain.yaml")
    with open(pipeline, "w") as f:
        f.write(chain(args.stages))
    mapped = os.path.join(d, "map.yaml")
    with open(mapped, "w") as f:
        f.write(fan(args.items))
    bare, floor, ours, bare_map, our_map = [], [], [], [], []
    try:
        for r in range(args.rounds):
            t = time.perf_counter()
            for _ in range(args.stages):
                subprocess.run(["sbatch", "--wait", "--quiet", "-o", "/dev/null", "--wrap", "true"],
                               env=env, check=True, cwd=d)
            bare.append((time.perf_counter() - t) / args.stages)
            t = time.perf_counter()
            for _ in range(args.stages):
                job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"],
                                     env=env, check=True, cwd=d, capture_output=True,
                                     text=True).stdout.strip()
                while subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], env=env,
                                     capture_output=True, text=True).stdout.strip() != "COMPLETED":
                    time.sleep(0.02)
            floor.append((time.perf_counter() - t) / args.stages)
            home = os.path.join(d, f"home-{r}")
            os.makedirs(home)
            t = time.perf_counter()
            subprocess.run([BIN, "run", pipeline, "--executor", "slurm"], env=env, cwd=home,
                           check=True, stdout=subprocess.DEVNULL)
            ours.append((time.perf_counter() - t) / args.stages)
            t = time.perf_counter()
            subprocess.run(["sbatch", "--wait", "--quiet", "-o", "/dev/null", f"--array=0-{args.items - 1}",
                            "--wrap", "true"], env=env, check=True, cwd=d)
            bare_map.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run([BIN, "run", mapped, "--executor", "slurm"], env=env, cwd=home,
                           check=True, stdout=subprocess.DEVNULL)
            our_map.append(time.perf_counter() - t)
            print(f"round {r + 1}: map of {args.items}: sbatch --wait --array {bare_map[-1]:.2f} s, "
                  f"drivetrain {our_map[-1]:.2f} s")
            print(f"round {r + 1}: sbatch --wait {bare[-1]:.3f} s/job, floor {floor[-1]:.3f} s/job, "
                  f"drivetrain {ours[-1]:.3f} s/stage")
    finally:
        subprocess.run(["bash", CLUSTER, "stop", cluster])
        shutil.rmtree(d, ignore_errors=True)
    b, f, o = statistics.median(bare), statistics.median(floor), statistics.median(ours)
    print(f"\n| per job / stage | sbatch --wait | floor (squeue every 20 ms) | drivetrain (poll {args.poll}) "
          "| drivetrain / sbatch --wait | drivetrain − floor |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| `true`, {args.stages} in a chain, median of {args.rounds} | {b:.3f} s | {f:.3f} s | {o:.3f} s "
          f"| **{o / b:.2f}** | {1000 * (o - f):.0f} ms |")
    bm, om = statistics.median(bare_map), statistics.median(our_map)
    print(f"\n| a map of {args.items} | sbatch --wait --array | drivetrain (one job array) | drivetrain / sbatch |")
    print("|---|---:|---:|---:|")
    print(f"| `true`, median of {args.rounds} | {bm:.2f} s | {om:.2f} s | **{om / bm:.2f}** |")


if __name__ == "__main__":
    main()
