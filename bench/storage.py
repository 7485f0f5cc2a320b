#!/usr/bin/env python3
"""Storage backends: S3 artifact throughput against boto3, and state store transitions.

--suite s3: a 1 GiB file (random bytes) uploaded to and downloaded from a loopback S3
server (`moto_server`, started here) as drivetrain publishes a stage output and
materializes a stage input (`store-transfer`: multipart upload, 16 MiB parts, 8 in
flight; ranged parallel download), against boto3's managed transfer (`upload_file` /
`download_file`, its defaults: 8 MiB parts, 10 threads) of the same file to the same
server, alternating, several repetitions. Ratio = boto3 time / drivetrain time (above 1:
drivetrain is faster). Peak RSS of each drivetrain process is read from wait4.

--suite state: `state-transitions` records N stages going Pending → Running → Succeeded
(start_attempt, finish_attempt, set_stage: two transitions, three statements each) on
SQLite (a file in WAL mode, as `.drivetrain/state.db`) and on PostgreSQL (a cluster
initialized and started here on loopback, fsync on).

Needs the tests' venv (moto, boto3) and a release build:
  cargo build --release -p drivetrain-bench
  ~/.cache/drivetrain/venv/bin/python bench/storage.py --suite s3|state|all
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

from pg import start_postgres
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get(
    "CARGO_TARGET_DIR", os.path.expanduser("~/.cache/drivetrain/target")
)
VENV = os.path.expanduser("~/.cache/drivetrain/venv")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port, path="/", timeout=60):
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2)
            return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"server on {port} did not start")


def run_measured(cmd, env):
    """Runs cmd; answers (stdout, wall seconds, peak RSS MiB)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"{cmd[0]} failed: {err.decode()}")
    return out.decode(), wall, usage.ru_maxrss / 1024


def s3_suite(args):
    import boto3

    binary = os.path.join(TARGET, "release", "store-transfer")
    port = free_port()
    work = tempfile.mkdtemp(prefix="dt-bench-s3-")
    moto = subprocess.Popen(
        [os.path.join(VENV, "bin", "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(port)
        endpoint = f"http://127.0.0.1:{port}"
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        s3.create_bucket(Bucket="bench")
        src = os.path.join(work, "src")
        os.makedirs(src)
        path = os.path.join(src, "blob.bin")
        size = args.mib << 20
        with open(path, "wb") as f:
            for _ in range(args.mib // 64):
                f.write(os.urandom(64 << 20))
        env = dict(
            os.environ,
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="us-east-1",
            AWS_ALLOW_HTTP="true",
        )
        rows = {"boto3 up": [], "boto3 down": [], "dt up": [], "dt down": [], "rss": []}

        def clear():
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench"):
                for o in page.get("Contents", []):
                    s3.delete_object(Bucket="bench", Key=o["Key"])

        for rep in range(args.reps):
            t = time.perf_counter()
            s3.upload_file(path, "bench", "boto3/blob.bin")
            rows["boto3 up"].append(time.perf_counter() - t)
            dst = os.path.join(work, "boto3.bin")
            t = time.perf_counter()
            s3.download_file("bench", "boto3/blob.bin", dst)
            rows["boto3 down"].append(time.perf_counter() - t)
            os.remove(dst)
            clear()
            scratch = os.path.join(work, f"dt-{rep}")
            out, _, rss = run_measured(
                [binary, "s3://bench/dt", src, scratch], env
            )
            got = json.loads(out)
            assert os.path.getsize(os.path.join(scratch, "blob.bin")) == size
            shutil.rmtree(scratch)
            rows["dt up"].append(got["upload_s"])
            rows["dt down"].append(got["download_s"])
            rows["rss"].append(rss)
            clear()
            print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in rows.items()), file=sys.stderr)
        med = {k: statistics.median(v) for k, v in rows.items()}
        mib = args.mib
        print(f"\n{mib} MiB to moto_server on loopback, median of {args.reps}:\n")
        print("| transfer | boto3 | drivetrain | ratio (boto3 / drivetrain) |")
        print("|---|---:|---:|---:|")
        for d, b, o in [("upload", "boto3 up", "dt up"), ("download", "boto3 down", "dt down")]:
            print(
                f"| {d} | {med[b]:.2f} s ({mib / med[b]:.0f} MiB/s) | {med[o]:.2f} s ({mib / med[o]:.0f} MiB/s) | {med[b] / med[o]:.2f}× |"
            )
        print(f"\ndrivetrain peak RSS: {max(rows['rss']):.0f} MiB")
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


def state_suite(args):
    binary = os.path.join(TARGET, "release", "state-transitions")
    work = tempfile.mkdtemp(prefix="dt-bench-state-")
    results = {}
    try:
        out, _, _ = run_measured(
            [binary, "sqlite", os.path.join(work, "state.db"), str(args.stages)], dict(os.environ)
        )
        results["SQLite (WAL, synchronous=NORMAL)"] = json.loads(out)
        url, stop_pg = start_postgres(work)
        try:
            out, _, _ = run_measured(
                [binary, "postgres", url, str(args.stages)],
                dict(os.environ),
            )
            results["PostgreSQL 15 (loopback, fsync on)"] = json.loads(out)
        finally:
            stop_pg()
        base = sqlite_baseline(os.path.join(work, "baseline.db"), args.stages)
        print(f"\n{args.stages} stages, each start_attempt + finish_attempt + set_stage:\n")
        print("| store | transitions/s | statements/s |")
        print("|---|---:|---:|")
        for name, r in results.items():
            print(f"| {name} | {r['transitions_per_s']:,.0f} | {r['statements_per_s']:,.0f} |")
        print(f"| baseline: Python sqlite3, the same statements, a commit each | {base:,.0f} | {base * 1.5:,.0f} |")
        sq = results["SQLite (WAL, synchronous=NORMAL)"]["transitions_per_s"]
        print(f"\nSQLite: drivetrain / baseline = {sq / base:.2f}×")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sqlite_baseline(path, n):
    """Transitions/s of the same three statements per stage, from Python's sqlite3 with the
    engine's pragmas and one commit per statement (start_attempt's two in one)."""
    import sqlite3

    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute(
        "CREATE TABLE attempts (run_id TEXT, stage TEXT, attempt INTEGER, phase TEXT, started_at TEXT, "
        "finished_at TEXT, exit_code INTEGER, reason TEXT, PRIMARY KEY (run_id, stage, attempt))"
    )
    c.execute(
        "CREATE TABLE stages (run_id TEXT, stage TEXT, phase TEXT, attempts INTEGER, started_at TEXT, "
        "finished_at TEXT, exit_code INTEGER, reason TEXT, PRIMARY KEY (run_id, stage))"
    )
    now = lambda: time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    t = time.perf_counter()
    for i in range(n):
        s = f"s{i}"
        c.execute("BEGIN")
        c.execute(
            "INSERT INTO attempts (run_id, stage, attempt, phase, started_at) VALUES ('r', ?, 1, 'Running', ?) "
            "ON CONFLICT (run_id, stage, attempt) DO UPDATE SET phase = 'Running' WHERE attempts.phase = 'Running'",
            (s, now()),
        )
        c.execute(
            "INSERT INTO stages (run_id, stage, phase, attempts, started_at) VALUES ('r', ?, 'Running', 1, ?) "
            "ON CONFLICT (run_id, stage) DO UPDATE SET phase = 'Running', attempts = 1",
            (s, now()),
        )
        c.execute("COMMIT")
        c.execute(
            "UPDATE attempts SET phase = 'Succeeded', finished_at = ?, exit_code = 0 WHERE run_id = 'r' AND stage = ? AND attempt = 1",
            (now(), s),
        )
        c.execute(
            "INSERT INTO stages (run_id, stage, phase, finished_at, exit_code) VALUES ('r', ?, 'Succeeded', ?, 0) "
            "ON CONFLICT (run_id, stage) DO UPDATE SET phase = 'Succeeded', finished_at = ?, exit_code = 0",
            (s, now(), now()),
        )
    secs = time.perf_counter() - t
    c.close()
    return 2 * n / secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", choices=["s3", "state", "all"], default="all")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--stages", type=int, default=20000)
    args = ap.parse_args()
    if args.suite in ("state", "all"):
        state_suite(args)
    if args.suite in ("s3", "all"):
        s3_suite(args)


if __name__ == "__main__":
    main()
