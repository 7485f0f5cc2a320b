#!/usr/bin/env python3
"""GPU scheduling (issue 50; see README.md here, "GPU scheduling"), in one run:

--suite ledger: what the home's ledger costs a stage. A run of `--stages` stages of
`true`, one at a time (`--parallelism 1`), each asking `resources: {gpu: 1}` of a
machine given one GPU (`--gpus 1`), so every stage claims the device through the ledger
(one transaction) and gives it back; the same run with `resources: {cpu: 1, memory:
64Mi}` instead (held in the ledger as CPU and memory); against the same run with nothing
declared (no ledger): per stage, the difference of the runs' wall times divided by the
stages. On SQLite (the home's file) and on PostgreSQL (a
cluster of its own on loopback, `bench/pg.py`), rounds interleaved, medians.

--suite preempt: how long a higher priority waits when it must preempt. `serve` on a
machine of two GPUs (`DRIVETRAIN_LOCAL_GPUS=2`); a preemptible priority-1 stage holding
both (it saves its state and exits on SIGTERM, as a checkpointing trainer does); then a
priority-10 stage asking for both is submitted over HTTP: from the POST to the first
line its command prints (its own clock), against the same stage submitted with both GPUs
free (the baseline, in the same run). Medians over `--rounds`.

  cargo build --release --bin drivetrain
  ~/.cache/drivetrain/venv/bin/python bench/scheduling.py --suite ledger|preempt|all
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pg import start_postgres  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BIN = os.path.join(TARGET, "release", "drivetrain")
TOKEN = "bench-token"


KINDS = {"plain": None, "gpu": "{gpu: 1}", "cpu": "{cpu: 1, memory: 64Mi}"}


def stages(n, kind):
    lines = ["version: 1", "name: ledger", "stages:"]
    for i in range(n):
        lines.append(f"  s{i}:")
        if KINDS[kind]:
            lines.append(f"    resources: {KINDS[kind]}")
        lines.append('    run: {command: ["true"]}')
    return "\n".join(lines) + "\n"


def timed_run(work, file, env):
    t = time.perf_counter()
    subprocess.run(
        [BIN, "run", file, "--parallelism", "1", "--gpus", "1"],
        cwd=work, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def ledger_suite(args):
    work = tempfile.mkdtemp(prefix="dt-bench-ledger-")
    os.chmod(work, 0o777)
    try:
        files = {}
        for kind in KINDS:
            files[kind] = os.path.join(work, f"{kind}.yaml")
            with open(files[kind], "w") as f:
                f.write(stages(args.stages, kind))
        pg_work = os.path.join(work, "pgwork")
        os.makedirs(pg_work)
        url, stop_pg = start_postgres(pg_work) if args.postgres else (None, None)
        try:
            stores = {"SQLite": None}
            if url:
                stores["PostgreSQL"] = url
            rows = []
            for name, state in stores.items():
                env = dict(os.environ)
                env.pop("DRIVETRAIN_HOME", None)
                if state:
                    env["DRIVETRAIN_STATE"] = state
                times = {kind: [] for kind in KINDS}
                timed_run(work, files["plain"], env)  # warm: the home and its schema
                for _ in range(args.rounds):
                    for kind in KINDS:
                        times[kind].append(timed_run(work, files[kind], env))
                per = {k: statistics.median(t) / args.stages * 1000 for k, t in times.items()}
                rows.append((name, per))
        finally:
            if stop_pg:
                stop_pg()
        print(f"ledger: {args.stages} stages, --parallelism 1, medians of {args.rounds} rounds")
        print("| state store | ms a stage, nothing declared | 1 GPU (ledger) | the ledger, ms a claim | ratio | 1 CPU and 64Mi (ledger) | the ledger, ms a claim | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for name, p in rows:
            base = p["plain"]
            print(
                f"| {name} | {base:.2f} | {p['gpu']:.2f} | {p['gpu'] - base:.2f} | {p['gpu'] / base:.2f}× "
                f"| {p['cpu']:.2f} | {p['cpu'] - base:.2f} | {p['cpu'] / base:.2f}× |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def call(addr, method, path, body=None):
    req = urllib.request.Request(
        f"http://{addr}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
        return json.loads(text) if text.startswith(("{", "[")) else text


def stage_of(addr, run, name):
    v = call(addr, "GET", f"/api/v1/runs/{run}")
    return next((s for s in v.get("stages", []) if s["stage"] == name), None), v


def until(pred, what, limit=60):
    end = time.time() + limit
    while time.time() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


HOLD = """version: 1
name: hold
stages:
  hold:
    resources: {gpu: 2}
    scheduling: {priority: 1, preemptible: true, grace: 30s}
    run: {command: [sh, -c, 'trap "exit 143" TERM; sleep 600 & wait $!']}
"""
URGENT = """version: 1
name: urgent
stages:
  urgent:
    resources: {gpu: 2}
    scheduling: {priority: 10}
    run: {command: [sh, -c, 'date +%s.%N']}
"""


def urgent_start(addr):
    """Submits `urgent`; seconds from the POST to its command's first line."""
    t0 = time.time()
    run = call(addr, "POST", "/api/v1/runs", {"pipeline": "urgent"})["run"]
    until(lambda: call(addr, "GET", f"/api/v1/runs/{run}")["run"]["phase"] == "Succeeded", "urgent")
    log = call(addr, "GET", f"/api/v1/runs/{run}/logs?stage=urgent")
    return float(log.strip().splitlines()[0]) - t0


def preempt_another_engine(work, env, addr):
    """The holder in a `drivetrain run` of its own (another process on the home): seen
    through the ledger's poll, not this process's notice."""
    hold = subprocess.Popen(
        [BIN, "run", os.path.join(work, "served", "hold.yaml")],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )

    def holding():
        q = subprocess.run([BIN, "queue", "-o", "json"], cwd=work, env=env, capture_output=True, text=True)
        return q.returncode == 0 and any(
            e["state"] == "holding" and e["holder"] == "hold#1" for e in json.loads(q.stdout)["entries"]
        )

    until(holding, "the other engine's holder")
    time.sleep(0.5)
    took = urgent_start(addr)
    hold.terminate()
    hold.wait()
    return took


def preempt_suite(args):
    work = tempfile.mkdtemp(prefix="dt-bench-preempt-")
    os.chmod(work, 0o777)
    os.makedirs(os.path.join(work, "served"))
    for name, text in (("hold", HOLD), ("urgent", URGENT)):
        with open(os.path.join(work, "served", f"{name}.yaml"), "w") as f:
            f.write(text)
    env = dict(os.environ, DRIVETRAIN_LOCAL_GPUS="2")
    env.pop("DRIVETRAIN_HOME", None)
    serve = subprocess.Popen(
        [BIN, "serve", "--pipelines", "served", "--bind", "127.0.0.1:0", "--token", TOKEN],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        addr = None
        for line in serve.stdout:
            if line.startswith("listening on http://"):
                addr = line.strip().removeprefix("listening on http://")
                break
        free, preempted, other = [], [], []
        for _ in range(args.rounds):
            other.append(preempt_another_engine(work, env, addr))
            free.append(urgent_start(addr))
            hold = call(addr, "POST", "/api/v1/runs", {"pipeline": "hold"})["run"]
            until(lambda: (stage_of(addr, hold, "hold")[0] or {}).get("phase") == "Running", "hold running")
            time.sleep(0.5)
            preempted.append(urgent_start(addr))
            until(lambda: call(addr, "GET", f"/api/v1/runs/{hold}")["run"]["phase"] in ("Running",), "hold requeued")
            call(addr, "POST", f"/api/v1/runs/{hold}/cancel", {})
            until(lambda: call(addr, "GET", f"/api/v1/runs/{hold}")["run"]["phase"] == "Cancelled", "hold cancelled")
        f, p = statistics.median(free), statistics.median(preempted)
        print(f"preempt: medians of {args.rounds} rounds")
        print("| submitted with | POST to the stage's first line | ratio |")
        print("|---|---|---|")
        print(f"| both GPUs free (baseline) | {f * 1000:.0f} ms | 1.00× |")
        print(f"| both held by a preemptible stage | {p * 1000:.0f} ms | {p / f:.2f}× |")
        o = statistics.median(other)
        print(f"| both held by a preemptible stage of another engine (`drivetrain run`) | {o * 1000:.0f} ms | {o / f:.2f}× |")
    finally:
        serve.kill()
        serve.wait()
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", choices=["ledger", "preempt", "all"], default="all")
    ap.add_argument("--stages", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-postgres", dest="postgres", action="store_false")
    args = ap.parse_args()
    if args.suite in ("ledger", "all"):
        ledger_suite(args)
    if args.suite in ("preempt", "all"):
        preempt_suite(args)


if __name__ == "__main__":
    main()
