#!/usr/bin/env python3
"""Requests per second of the run list (`GET /api/v1/runs?limit=50`) on a home of
100,000 runs, with no filter and with each filter (bench/README.md, "The run list").

Makes a home with one real run (so the state database has the binary's schema), adds
99,999 runs to `runs` with sqlite3 (two pipelines, four phases, three triggers, a run a
second), copies it for each binary given (each migrates its own copy), starts `serve`
on each in turn and sends the requests one after another on one kept-alive connection
for a few seconds per filter. Prints a table: requests per second per binary, and the
ratio to the first binary. Standard library only.

Usage: bench/run_list.py NEW_BINARY [BASELINE_BINARY]
"""
import http.client
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

RUNS = 100_000
SECONDS = 3
FILTERS = [
    ("none", ""),
    ("pipeline", "&pipeline=nightly"),
    ("phase=failed", "&phase=failed"),
    ("trigger=api", "&trigger=api"),
    ("since (the newest 2,800)", "&since=2026-01-02T03:00:00.000Z"),
    ("all four", "&pipeline=nightly&phase=failed&trigger=api&since=2026-01-01T12:00:00.000Z"),
]


def make_home(binary, home):
    with open(os.path.join(home, "p.yaml"), "w") as f:
        f.write('version: 1\nname: nightly\nstages:\n  a:\n    run: {command: ["true"]}\n')
    subprocess.run([binary, "run", "p.yaml"], cwd=home, check=True, capture_output=True)
    db = sqlite3.connect(os.path.join(home, ".drivetrain", "state.db"))
    columns = [r[1] for r in db.execute("PRAGMA table_info(runs)")]
    template = dict(zip(columns, db.execute("SELECT * FROM runs").fetchone()))
    phases, triggers = ["Succeeded", "Succeeded", "Failed", "Cancelled"], ["schedule", "cli", "api"]
    rows = []
    for i in range(1, RUNS):
        r = dict(template)
        r["id"] = f"20260101-{i:06d}-bench"
        r["pipeline"] = ["nightly", "weekly"][i % 2]
        r["phase"] = phases[i % 4]
        r["trigger"] = triggers[i % 3]
        r["engine_pid"] = None
        secs = i  # one run a second from 2026-01-01T00:00:00Z
        r["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1767225600 + secs)) + ".000Z"
        rows.append(tuple(r[c] for c in columns))
    marks = ",".join("?" * len(columns))
    db.executemany(f"INSERT INTO runs ({','.join(columns)}) VALUES ({marks})", rows)
    db.commit()
    db.close()


def serve(binary, home):
    p = subprocess.Popen([binary, "ui", "--bind", "127.0.0.1:0"], cwd=home,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("listening on http://"):
            host, port = line.strip().removeprefix("listening on http://").rsplit(":", 1)
            return p, host, int(port)
    raise RuntimeError("serve did not start")


def rate(host, port, query):
    c = http.client.HTTPConnection(host, port, timeout=60)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < SECONDS:
        c.request("GET", f"/api/v1/runs?limit=50{query}")
        r = c.getresponse()
        body = r.read()
        assert r.status == 200, body[:200]
        n += 1
    c.close()
    return n / (time.perf_counter() - start)


def main():
    binaries = [os.path.abspath(b) for b in sys.argv[1:]]
    if not binaries:
        sys.exit(__doc__)
    work = tempfile.mkdtemp(prefix="dt-runlist-")
    try:
        base = os.path.join(work, "base")
        os.mkdir(base)
        # The oldest binary makes the schema; each newer one migrates its own copy.
        make_home(binaries[-1], base)
        results = []
        for i, b in enumerate(binaries):
            home = os.path.join(work, f"home{i}")
            shutil.copytree(base, home)
            p, host, port = serve(b, home)
            try:
                results.append([rate(host, port, q) for _, q in FILTERS])
            finally:
                p.terminate()
                p.wait()
        head = " | ".join(os.path.basename(b) for b in binaries)
        print(f"| filter ({RUNS:,} runs, limit=50) | {head} |" + (" ratio |" if len(binaries) > 1 else ""))
        print("|---|" + "---:|" * (len(binaries) + (len(binaries) > 1)))
        for j, (name, _) in enumerate(FILTERS):
            cells = " | ".join(f"{r[j]:,.0f}/s" for r in results)
            ratio = f" {results[0][j] / results[-1][j]:.1f}× |" if len(binaries) > 1 else ""
            print(f"| {name} | {cells} |{ratio}")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
