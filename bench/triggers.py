#!/usr/bin/env python3
"""Triggers: how long from an object landing to its run starting, and what a listing
cursor costs over a prefix of 100,000 objects (see README.md here).

Latency (`--suite latency`): `drivetrain serve` with three triggers on one pipeline
(min_items 1), each fed N objects one at a time, 2 s apart:
  - `local`:  a `file://` prefix, listed every `poll` (1 s);
  - `listed`: a moto S3 prefix, listed from its cursor every `poll` (1 s);
  - `queued`: a moto S3 prefix whose bucket notifications go to an SQS queue (moto's real
    S3 -> SQS), received with 1 s long polls; its listing is hourly.
Latency = the run's `created_at` (recorded Running with its objects' claim) minus the
moment the object's write returned. Baselines in the same run: for the listings, the poll
interval (a listing's expected wait is half of it); for notifications, the same put on a
second prefix whose notifications go to a second queue that this script long-polls itself
(the floor of moto's notification path).

Cursor (`--suite cursor`): 100,000 objects under a `file://` prefix and (with
`--s3-objects`) under a moto S3 prefix; `trigger-cursor` (bench/src/bin) times a whole
listing, a listing from the cursor with nothing new, and the inbox writes of a rescan
(all new, then all known). The baseline for the local listing is Python's `os.walk` of the
same tree.

  cargo build --release --bin drivetrain && cargo build --release -p drivetrain-bench
  ~/.cache/drivetrain/venv/bin/python bench/triggers.py [--suite latency|cursor|all]
      [--objects 10] [--cursor-objects 100000] [--s3-objects 100000]
"""

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
VENV = os.path.expanduser("~/.cache/drivetrain/venv/bin")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def moto():
    port = free_port()
    log = open(os.path.join(tempfile.gettempdir(), f"bench-moto-{port}.log"), "w")
    p = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                         stdout=log, stderr=log, start_new_session=True)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    import boto3
    kw = dict(endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
              aws_access_key_id="testing", aws_secret_access_key="testing")
    env = {"AWS_ENDPOINT_URL": kw["endpoint_url"], "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    return p, boto3.client("s3", **kw), boto3.client("sqs", **kw), env


def ts(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def latency(args):
    p, s3, sqs, env = moto()
    try:
        s3.create_bucket(Bucket="fleet")
        queues = {}
        configs = []
        for name, prefix in [("events", "queued/"), ("floor", "floor/")]:
            url = sqs.create_queue(QueueName=name)["QueueUrl"]
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            queues[name] = url
            configs.append({"QueueArn": arn, "Events": ["s3:ObjectCreated:*"],
                            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}}})
        s3.put_bucket_notification_configuration(
            Bucket="fleet", NotificationConfiguration={"QueueConfigurations": configs})
        for q in queues.values():  # moto's s3:TestEvent
            sqs.purge_queue(QueueUrl=q)
        home = tempfile.mkdtemp(prefix="bench-triggers-")
        local = os.path.join(home, "incoming")
        os.makedirs(local)
        os.makedirs(os.path.join(home, "pipes"))
        with open(os.path.join(home, "pipes", "p.yaml"), "w") as f:
            f.write(f"""version: 1
name: latency
triggers:
  local:
    objects: {{source: "file://{local}/", poll: 1s}}
  listed:
    objects: {{source: "s3://fleet/listed/", poll: 1s}}
  queued:
    objects: {{source: "s3://fleet/queued/", queue: "{queues['events']}", poll: 1h, rescan: 1h}}
stages:
  a:
    run: {{command: ["true"]}}
""")
        binary = os.path.join(TARGET, "release", "drivetrain")
        serve = subprocess.Popen([binary, "serve", "--pipelines", "pipes", "--bind", "127.0.0.1:0"],
                                 cwd=home, env={**os.environ, **env, "DRIVETRAIN_HOME": os.path.join(home, "h")},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        landed = {}
        floor = []
        for i in range(args.objects):
            key = f"d{i:04d}.mcap"
            with open(os.path.join(local, "." + key), "w") as f:
                f.write(key)
            os.rename(os.path.join(local, "." + key), os.path.join(local, key))
            landed[f"file://{local}/{key}"] = time.time()
            s3.put_object(Bucket="fleet", Key=f"listed/{key}", Body=b"x")
            landed[f"s3://fleet/listed/{key}"] = time.time()
            s3.put_object(Bucket="fleet", Key=f"queued/{key}", Body=b"x")
            landed[f"s3://fleet/queued/{key}"] = time.time()
            s3.put_object(Bucket="fleet", Key=f"floor/{key}", Body=b"x")
            put = time.time()
            got = sqs.receive_message(QueueUrl=queues["floor"], WaitTimeSeconds=5, MaxNumberOfMessages=1)
            floor.append(time.time() - put)
            for m in got.get("Messages", []):
                sqs.delete_message(QueueUrl=queues["floor"], ReceiptHandle=m["ReceiptHandle"])
            time.sleep(2)
        time.sleep(3)
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        db = sqlite3.connect(os.path.join(home, "h", "state.db"))
        rows = db.execute("SELECT i.trigger_name, i.url, r.created_at FROM trigger_inbox i "
                          "JOIN runs r ON r.id = i.run_id").fetchall()
        by = {}
        for trig, url, created in rows:
            by.setdefault(trig, []).append(ts(created) - landed[url])
        out = {"objects": args.objects, "floor_notification_s": statistics.median(floor)}
        for trig, xs in sorted(by.items()):
            out[trig] = {"runs": len(xs), "p50_s": statistics.median(xs), "max_s": max(xs)}
        print(json.dumps(out, indent=2))
        shutil.rmtree(home, ignore_errors=True)
    finally:
        os.killpg(p.pid, signal.SIGKILL)


def cursor(args):
    tool = os.path.join(TARGET, "release", "trigger-cursor")
    tmp = tempfile.mkdtemp(prefix="bench-cursor-")
    tree = os.path.join(tmp, "incoming")
    n = args.cursor_objects
    for v in range(100):
        os.makedirs(os.path.join(tree, f"veh{v:03d}"))
    for i in range(n):
        with open(os.path.join(tree, f"veh{i % 100:03d}", f"d{i:06d}.mcap"), "w") as f:
            f.write("x")
    t = time.time()
    walked = sum(len(fs) for _, _, fs in os.walk(tree))
    walk_s = time.time() - t
    o = subprocess.run([tool, f"file://{tree}/", os.path.join(tmp, "state.db")],
                       capture_output=True, text=True, check=True)
    local = json.loads(o.stdout)
    out = {"local": {**local, "python_os_walk_s": walk_s, "walked": walked}}
    if args.s3_objects:
        p, s3, _, env = moto()
        try:
            s3.create_bucket(Bucket="fleet")
            t = time.time()
            with cf.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: s3.put_object(Bucket="fleet", Key=f"incoming/veh{i % 100:03d}/d{i:06d}.mcap", Body=b"x"),
                            range(args.s3_objects)))
            fill_s = time.time() - t
            o = subprocess.run([tool, "s3://fleet/incoming/", os.path.join(tmp, "state-s3.db")],
                               capture_output=True, text=True, check=True, env={**os.environ, **env})
            out["s3"] = {**json.loads(o.stdout), "fill_s": fill_s}
        finally:
            os.killpg(p.pid, signal.SIGKILL)
    print(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="all", choices=["latency", "cursor", "all"])
    ap.add_argument("--objects", type=int, default=10)
    ap.add_argument("--cursor-objects", type=int, default=100_000)
    ap.add_argument("--s3-objects", type=int, default=0)
    args = ap.parse_args()
    if args.suite in ("latency", "all"):
        latency(args)
    if args.suite in ("cursor", "all"):
        cursor(args)


if __name__ == "__main__":
    sys.exit(main())
