#!/usr/bin/env python3
"""1,000 cron schedules firing every minute: schedule lag and the server's CPU and memory.

Writes N pipelines (default 1,000), each `schedule: {cron: "* * * * *"}` with one trivial
stage (`true`), starts `drivetrain serve` on them, lets it run through M minute
boundaries (default 3), stops it with SIGTERM and reads every cron run from the state
store: lag = the run's start (`runs.created_at`: recorded Running, with its tick's claim)
minus its tick's `scheduled_time`; first stage start = its first attempt's start minus
the tick (a thousand processes queue for two cores there); end-to-end = the run's end
minus its tick. The server's CPU time and peak resident memory
come from /proc. The baseline in the same run is the same number of trivial processes
started one after another by Python (`subprocess.run(["true"])`): what the machine
needs just to start that many processes, against which the server's CPU per minute is
compared. Standard library only.

  python3 bench/schedules.py [--schedules 1000] [--minutes 3] [--binary target/release/drivetrain]
"""

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    # utime, stime, cutime, cstime (children: the stages' processes once reaped)
    return tuple(int(x) / tick for x in fields[11:15])


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def ts(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=1000)
    ap.add_argument("--minutes", type=int, default=3)
    ap.add_argument("--binary", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "drivetrain"))
    ap.add_argument("--parallelism", type=int, default=8)
    args = ap.parse_args()

    home = tempfile.mkdtemp(prefix="dt-bench-sched-")
    pdir = os.path.join(home, "pipelines")
    os.makedirs(pdir)
    for i in range(args.schedules):
        with open(os.path.join(pdir, f"s{i:04d}.yaml"), "w") as f:
            f.write(
                f"version: 1\nname: s{i:04d}\n"
                "schedule: {cron: \"* * * * *\", timezone: UTC, catchup: none}\n"
                "stages:\n  tick:\n    run: {command: [\"true\"]}\n"
            )
    env = dict(os.environ, NO_COLOR="1")
    env.pop("DRIVETRAIN_HOME", None)
    log = open(os.path.join(home, "serve.log"), "w")
    server = subprocess.Popen(
        [args.binary, "serve", "--pipelines", pdir, "--bind", "127.0.0.1:0",
         "--parallelism", str(args.parallelism)],
        cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT)
    start = time.time()
    # Through M minute boundaries after the first, then a margin for the last runs.
    first = (int(start) // 60 + 1) * 60
    end = first + 60 * (args.minutes - 1) + 20
    time.sleep(max(0, first - time.time() - 2))
    cpu0, t0 = cpu_seconds(server.pid), time.time()
    time.sleep(max(0, end - time.time()))
    cpu1, t1 = cpu_seconds(server.pid), time.time()
    rss = peak_rss_mib(server.pid)
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=120)

    db = sqlite3.connect(os.path.join(home, ".drivetrain", "state.db"))
    rows = db.execute(
        "SELECT scheduled_time, created_at, finished_at, phase FROM runs WHERE trigger = 'schedule'"
    ).fetchall()
    lag = [(ts(c) - ts(s)) * 1000 for s, c, _, _ in rows if s and c]
    # When each cron run's first stage actually started (its first attempt).
    started = db.execute(
        "SELECT r.scheduled_time, MIN(a.started_at) FROM runs r JOIN attempts a ON a.run_id = r.id "
        "WHERE r.trigger = 'schedule' GROUP BY r.id"
    ).fetchall()
    stage_lag = [(ts(a) - ts(s)) * 1000 for s, a in started if s and a]
    e2e = [(ts(f) - ts(s)) * 1000 for s, _, f, _ in rows if s and f]
    ok = sum(1 for r in rows if r[3] == "Succeeded")
    ticks = sorted({s for s, _, _, _ in rows})

    # Baseline: the same number of trivial processes, started one after another.
    b0 = time.perf_counter()
    for _ in range(args.schedules):
        subprocess.run(["true"])
    baseline = time.perf_counter() - b0

    own = (cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1])
    children = (cpu1[2] - cpu0[2]) + (cpu1[3] - cpu0[3])
    minutes = (t1 - t0) / 60
    result = {
        "schedules": args.schedules,
        "ticks": len(ticks),
        "runs": len(rows),
        "succeeded": ok,
        "lag_ms": {"p50": pct(lag, 50), "p99": pct(lag, 99), "max": max(lag, default=float("nan"))},
        "first_stage_start_ms": {"p50": pct(stage_lag, 50), "p99": pct(stage_lag, 99)},
        "end_to_end_ms": {"p50": pct(e2e, 50), "p99": pct(e2e, 99)},
        "server_cpu_s_per_minute": own / minutes,
        "stages_cpu_s_per_minute": children / minutes,
        "server_cpu_percent": 100 * own / (t1 - t0),
        "peak_rss_mib": rss,
        "baseline_python_start_s": baseline,
        "server_cpu_per_minute_vs_baseline": own / minutes / baseline,
    }
    print(json.dumps(result, indent=2))
    if ok < len(rows) or not rows:
        print(f"warning: {len(rows) - ok} runs did not succeed; see {home}", file=sys.stderr)


if __name__ == "__main__":
    main()
