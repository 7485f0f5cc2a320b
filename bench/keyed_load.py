#!/usr/bin/env python3
"""Exactly-once submission under keep-alive load (bench/README.md, "submissions under
load"): 300 clients, each on one keep-alive connection, submit runs with an
`Idempotency-Key` each for 60 s against `drivetrain serve`, on SQLite and on PostgreSQL.

A client sends a submission again, with the same key, when its answer is lost (the
connection closed or failed before the answer) or the server says to come back (503,
409 with `Retry-After`); it reconnects after a lost answer. To lose answers on purpose,
a share of submissions (`--drop`, default 5 %) is sent and the connection closed at once,
without reading the answer, then sent again with its key on a new connection. Every run carries its key as
its `tag` param. At the end the server's run list is compared with what the clients
heard: every run known to its client, no key with two runs, no run nobody heard of.

The pipeline is one approval gate: a run is created, started and ends `Waiting` without
a process, so what is measured is the API, the listener and the state store.
Standard library only. Usage: bench/keyed_load.py [BINARY] [--seconds 60] [--clients 300]
[--stores sqlite,postgres] [--drop 0.05]
"""
import argparse
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

from pg import start_postgres

TOKEN = "bench-token"
PIPELINE = """version: 1
name: keyed
params:
  tag: {type: string}
stages:
  gate:
    approval: {approvers: {role: safety, min: 1}}
"""


def start_serve(binary, home, state_url):
    os.makedirs(os.path.join(home, "served"), exist_ok=True)
    with open(os.path.join(home, "served", "keyed.yaml"), "w") as f:
        f.write(PIPELINE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRIVETRAIN_")}
    if state_url:
        env["DRIVETRAIN_STATE"] = state_url
    proc = subprocess.Popen(
        [binary, "serve", "--pipelines", "served", "--bind", "127.0.0.1:0", "--token", TOKEN],
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    for line in proc.stdout:
        if line.startswith("listening on http://"):
            host, port = line.strip().removeprefix("listening on http://").rsplit(":", 1)
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, (host, int(port))
    raise SystemExit("serve did not start")


class Client(threading.Thread):
    """One keep-alive connection submitting keyed runs until `deadline`."""

    def __init__(self, n, addr, deadline, drop):
        super().__init__(daemon=True)
        self.n, self.addr, self.deadline, self.drop = n, addr, deadline, drop
        self.known = {}  # key -> run
        self.causes = Counter()  # why a submission was sent again
        self.replays = 0
        self.refused = Counter()  # final answers that were not 201
        self.gave_up = 0

    def connect(self):
        return http.client.HTTPConnection(*self.addr, timeout=60)

    def submit(self, conn, key):
        body = json.dumps({"pipeline": "keyed", "params": {"tag": key}})
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", "Idempotency-Key": key}
        for attempt in range(30):
            try:
                conn.request("POST", "/api/v1/runs", body, headers)
                if attempt == 0 and random.random() < self.drop:
                    # A client that loses its answer: it hangs up without reading it.
                    self.causes["hung up before the answer"] += 1
                    conn.close()
                    conn = self.connect()
                    continue
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                self.causes["answer lost"] += 1
                conn.close()
                conn = self.connect()
                continue
            if resp.status in (409, 503):
                self.causes[str(resp.status)] += 1
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = self.connect()
                time.sleep(float(resp.getheader("Retry-After", "1")))
                continue
            if resp.status == 201:
                self.known[key] = json.loads(data)["run"]
                self.replays += resp.getheader("Idempotent-Replayed") == "true"
            else:
                self.refused[resp.status] += 1
            return conn
        self.gave_up += 1
        return conn

    def run(self):
        conn, i = self.connect(), 0
        while time.monotonic() < self.deadline:
            conn = self.submit(conn, f"c{self.n}-{i}")
            i += 1
        conn.close()


def runs_of(addr):
    conn = http.client.HTTPConnection(*addr, timeout=300)
    conn.request("GET", "/api/v1/runs?pipeline=keyed&limit=1000000", headers={"Authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 200, body
    return body["runs"] if isinstance(body, dict) else body


def one_store(binary, name, state_url, args):
    home = tempfile.mkdtemp(prefix=f"dt-bench-keyed-{name}-")
    proc, addr = start_serve(binary, home, state_url)
    try:
        deadline = time.monotonic() + args.seconds
        clients = [Client(n, addr, deadline, args.drop) for n in range(args.clients)]
        started = time.monotonic()
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        took = time.monotonic() - started
        runs = runs_of(addr)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(home, ignore_errors=True)
    known = {k: r for c in clients for k, r in c.known.items()}
    by_tag = Counter(r["params"].get("tag") for r in runs)
    stored = {r["id"] for r in runs}
    causes = sum((c.causes for c in clients), Counter())
    return {
        "store": name,
        "seconds": round(took, 1),
        "accepted": len(known),
        "per_s": round(len(known) / took, 1),
        "runs": len(runs),
        "doubled": sum(1 for n in by_tag.values() if n > 1),
        "unheard": len(stored - set(known.values())),
        "unknown_to_store": len(set(known.values()) - stored),
        "mismatched": sum(1 for r in runs if known.get(r["params"].get("tag"), r["id"]) != r["id"]),
        "sent_again": dict(causes),
        "replays": sum(c.replays for c in clients),
        "refused": dict(sum((c.refused for c in clients), Counter())),
        "gave_up": sum(c.gave_up for c in clients),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "drivetrain"))
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--clients", type=int, default=300)
    p.add_argument("--stores", default="sqlite,postgres")
    p.add_argument("--drop", type=float, default=0.05, help="the share of submissions whose client hangs up before the answer")
    args = p.parse_args()
    results = []
    for store in args.stores.split(","):
        work = tempfile.mkdtemp(prefix="dt-bench-keyed-pg-")
        stop = None
        try:
            url = None
            if store == "postgres":
                url, stop = start_postgres(work, "-c max_connections=200")
            r = one_store(args.binary, store, url, args)
        finally:
            if stop:
                stop()
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(r), file=sys.stderr)
        results.append(r)
    print(f"\n{args.clients} keep-alive clients, {args.seconds:g} s, one Idempotency-Key per submission:\n")
    print("| store | accepted | per s | runs stored | doubled | stored, unheard | heard, not stored | sent again (why) | replays | gave up |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in results:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(r["sent_again"].items())) or "-"
        print(
            f"| {r['store']} | {r['accepted']:,} | {r['per_s']:,} | {r['runs']:,} | {r['doubled']} | {r['unheard']} "
            f"| {r['unknown_to_store']} | {why} | {r['replays']} | {r['gave_up']} |"
        )
    bad = [r for r in results if r["doubled"] or r["unheard"] or r["unknown_to_store"] or r["mismatched"] or r["gave_up"]]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
