#!/usr/bin/env python3
"""Benchmarks of the driving-loop steps against Python baselines on the same data, same run.

  ingest: MCAP → Parquet frames, `drivetrain step ingest` against the Python `mcap` reader
          assembling the same frames (a /vehicle message's own fields, the other channels held
          with their age) and writing
          them with pyarrow. Throughput in MB/s of MCAP read.
  mine:   the reference rule set of pipelines/driving-loop.yaml over an N-million-frame
          table, `drivetrain step mine-corner-cases` (DataFusion) against DuckDB running the
          same SQL on the same Parquet, both writing the matches to Parquet. Rows/s and peak
          memory, at several table sizes, for the table as `ingest` writes it (its footer
          says it is sorted by drive and time), the same order without that claim, and the
          rows shuffled.

Needs a release build (`cargo build --release`) and a venv with the baselines:
  python3 -m venv ~/.cache/drivetrain/bench-venv
  ~/.cache/drivetrain/bench-venv/bin/pip install mcap pyarrow duckdb
  ~/.cache/drivetrain/bench-venv/bin/python bench/steps.py [--suite ingest|mine|all]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RULES = {
    "hard_brake": "accel_x < -4.0",
    "low_confidence_night": "lane_confidence < 0.35 AND speed_mps > 10 AND time_of_day = 'night'",
    "sharp_steer": "abs(steering - lag(steering) OVER (PARTITION BY drive ORDER BY ts)) > 0.3",
    "close_pedestrian": "object_class = 'pedestrian' AND object_distance_m < 8",
}


def binary():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    b = os.path.join(target, "release", "drivetrain")
    if not os.path.exists(b):
        sys.exit(f"build first: cargo build --release ({b} missing)")
    return b


def timed(cmd, env=None):
    """Wall seconds and peak RSS (KiB, from GNU time) of one run."""
    start = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return wall, int(out.stderr.strip().splitlines()[-1])


def step_env(tmp, config, inputs, outputs):
    env = {"PATH": os.environ["PATH"], "DRIVETRAIN_STEP_CONFIG": json.dumps(config),
           "DRIVETRAIN_VALUES": os.path.join(tmp, "values.json")}
    for k, v in inputs.items():
        env[f"DRIVETRAIN_INPUT_{k.upper()}"] = v
    for k, v in outputs.items():
        os.makedirs(v, exist_ok=True)
        env[f"DRIVETRAIN_OUTPUT_{k.upper()}"] = v
    return env


PY_INGEST = r'''
import json, os, sys
import pyarrow as pa, pyarrow.parquet as pq
from mcap.reader import make_reader
src, out = sys.argv[1], sys.argv[2]
F64 = ["speed_mps","accel_x","accel_y","yaw_rate","steering","brake_pressure","lat","lon",
       "lateral_offset_m","lane_confidence","object_distance_m","object_rel_speed_mps"]
OWN = F64[:8]
HELD = {"/lane": "lane_age_s", "/objects": "objects_age_s", "/context": "context_age_s",
        "/ground_truth": "ground_truth_age_s"}
GT = ["hard_brake","cut_in","pedestrian_close_call","low_lane_confidence"]
num = lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
for name in sorted(os.listdir(src)):
    drive = name.rsplit(".", 1)[0]
    cols = {c: [] for c in ["drive","ts","log_time_ns",*F64,"object_class","weather","time_of_day",
                            *["gt_" + g for g in GT], *HELD.values()]}
    held, since, pending, first = {}, {}, [], None
    def emit():
        global first
        for t, own in pending:
            first = t if first is None else first
            cols["drive"].append(drive); cols["ts"].append((t - first) / 1e9); cols["log_time_ns"].append(t)
            # A frame's own fields are its /vehicle message's; the other channels are held.
            for c in OWN: cols[c].append(num(own.get(c)))
            for c in F64[8:]:
                v = num(own.get(c))
                cols[c].append(v if v is not None else held.get(c))
            for c in ["object_class","weather","time_of_day", *["gt_" + g for g in GT]]: cols[c].append(held.get(c))
            for topic, c in HELD.items(): cols[c].append((t - since[topic]) / 1e9 if topic in since else None)
        pending.clear()
    with open(os.path.join(src, name), "rb") as f:
        for schema, channel, message in make_reader(f).iter_messages():
            t = channel.topic
            if t != "/vehicle" and t not in HELD:
                continue
            if pending and message.log_time > pending[0][0]:
                emit()
            v = json.loads(message.data)
            if t == "/vehicle":
                pending.append((message.log_time, v)); continue
            if t == "/lane":
                held["lateral_offset_m"] = num(v.get("lateral_offset_m")); held["lane_confidence"] = num(v.get("lane_confidence"))
            elif t == "/objects":
                held["object_distance_m"] = num(v.get("distance_m")); held["object_rel_speed_mps"] = num(v.get("rel_speed_mps")); held["object_class"] = v.get("class")
            elif t == "/context":
                held["weather"] = v.get("weather"); held["time_of_day"] = v.get("time_of_day")
            elif t == "/ground_truth":
                held.update({"gt_" + k: v.get(k) for k in GT})
            since[t] = message.log_time
    emit()
    d = os.path.join(out, f"drive={drive}"); os.makedirs(d, exist_ok=True)
    pq.write_table(pa.table(cols), os.path.join(d, "part-00000.parquet"), compression="zstd")
'''


def simulate(b, tmp, drives, minutes):
    """`fleet-sim`'s logs of `drives` drives at 20 Hz under tmp/logs."""
    logs = os.path.join(tmp, "logs")
    cfg = {"drives": drives, "duration": f"{minutes}m", "rate_hz": 20, "seed": 1,
           "events": {"hard_brake": 1, "cut_in": 1, "pedestrian_close_call": 1, "low_lane_confidence": 1}}
    subprocess.run([b, "step", "fleet-sim"], env=step_env(tmp, cfg, {}, {"logs": logs}), check=True,
                   stdout=subprocess.DEVNULL)
    return logs


def ingest(b, drives, minutes):
    with tempfile.TemporaryDirectory() as tmp:
        logs = simulate(b, tmp, drives, minutes)
        mb = sum(os.path.getsize(os.path.join(logs, f)) for f in os.listdir(logs)) / 1e6
        frames = drives * minutes * 60 * 20
        rows = []
        for label, cmd, env in [
            ("python mcap + pyarrow", [sys.executable, "-c", PY_INGEST, logs, os.path.join(tmp, "py")], None),
            ("drivetrain step ingest", [b, "step", "ingest"],
             step_env(tmp, {}, {"logs": logs}, {"frames": os.path.join(tmp, "dt")})),
        ]:
            if label.startswith("python"):
                os.makedirs(os.path.join(tmp, "py"), exist_ok=True)
            wall, rss = timed(cmd, env)
            rows.append((label, wall, rss))
        base = rows[0][1]
        print(f"\ningest: {drives} drives × {minutes} min at 20 Hz = {frames:,} frames, {mb:.1f} MB of MCAP (zstd chunks)")
        print("\n| ingest | wall | MB/s | peak RSS | speed-up |")
        print("|---|---:|---:|---:|---:|")
        for label, wall, rss in rows:
            print(f"| {label} | {wall:.2f} s | {mb / wall:.1f} | {rss / 1024:.0f} MiB | {base / wall:.1f}× |")


REWRITE = r'''
import os, sys
from mcap.reader import make_reader
from mcap.writer import Writer
src, out, block = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name in sorted(os.listdir(src)):
    with open(os.path.join(src, name), "rb") as f:
        msgs = [(c.topic, c.message_encoding, s.name, s.encoding, s.data, m.log_time, m.data)
                for s, c, m in make_reader(f).iter_messages()]
    if block:
        # Blocks of messages in reverse order: chunks hold time ranges out of order, as
        # logs from several writers or chunks flushed out of order do.
        blocks = [msgs[i:i + block] for i in range(0, len(msgs), block)]
        msgs = [m for b in reversed(blocks) for m in b]
    with open(os.path.join(out, name), "wb") as f:
        w = Writer(f)
        w.start(profile="", library="bench rewrite")
        channels = {}
        for topic, enc, sname, senc, sdata, t, data in msgs:
            if topic not in channels:
                sid = w.register_schema(name=sname, encoding=senc, data=sdata)
                channels[topic] = w.register_channel(topic=topic, message_encoding=enc, schema_id=sid)
            w.add_message(channel_id=channels[topic], log_time=t, publish_time=t, data=data)
        w.finish()
'''


def ingest_out_of_order(b, drives, minutes):
    """The same logs rewritten by the Python `mcap` writer in order and with blocks of
    messages reversed: `ingest` streams the first and reads the second twice, putting its
    messages in order in memory."""
    with tempfile.TemporaryDirectory() as tmp:
        logs = simulate(b, tmp, drives, minutes)
        rows = []
        for label, block in [("in order", 0), ("blocks of 2,000 messages reversed", 2000)]:
            out = os.path.join(tmp, f"rewritten-{block}")
            os.makedirs(out)
            subprocess.run([sys.executable, "-c", REWRITE, logs, out, str(block)], check=True)
            mb = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)) / 1e6
            frames = os.path.join(tmp, f"frames-{block}")
            wall, rss = timed([b, "step", "ingest"], step_env(tmp, {}, {"logs": out}, {"frames": frames}))
            values = json.load(open(os.path.join(tmp, "values.json")))
            rows.append((label, wall, rss, mb, values["frames"], len(values.get("reordered", []))))
        if rows[0][4] != rows[1][4]:
            sys.exit(f"frames differ: {rows[0][4]} in order, {rows[1][4]} out of order")
        base_wall, base_rss = rows[0][1], rows[0][2]
        print(f"\ningest, logs out of order: {drives} drives × {minutes} min, {rows[0][4]:,} frames either way")
        print("\n| logs (Python mcap writer) | MB | reordered files | wall | peak RSS | time / in order | RSS / in order |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, wall, rss, mb, _, reordered in rows:
            print(f"| {label} | {mb:.1f} | {reordered} | {wall:.2f} s | {rss / 1024:.0f} MiB | "
                  f"{wall / base_wall:.2f}× | {rss / base_rss:.2f}× |")


GEN_SQL = """
COPY (
  SELECT 'drive-' || lpad(CAST(i // {per} AS VARCHAR), 5, '0') AS drive,
         (i % {per}) / 10.0 AS ts,
         CAST(1767254400000000000 + i * 100000000 AS BIGINT) AS log_time_ns,
         10 + 20 * random() AS speed_mps,
         CASE WHEN random() < 0.01 THEN -4 - 4 * random() ELSE random() - 0.5 END AS accel_x,
         random() - 0.5 AS accel_y, 0.1 * (random() - 0.5) AS yaw_rate,
         CASE WHEN random() < 0.002 THEN random() - 0.5 ELSE 0.05 * (random() - 0.5) END AS steering,
         10 * random() AS brake_pressure, 48.1 + random() / 100 AS lat, 11.5 + random() / 100 AS lon,
         random() - 0.5 AS lateral_offset_m,
         CASE WHEN random() < 0.02 THEN 0.3 * random() ELSE 0.6 + 0.4 * random() END AS lane_confidence,
         3 + 60 * random() AS object_distance_m, random() - 0.5 AS object_rel_speed_mps,
         CASE WHEN random() < 0.05 THEN 'pedestrian' ELSE 'car' END AS object_class,
         CASE WHEN random() < 0.2 THEN 'rain' ELSE 'clear' END AS weather,
         CASE WHEN (i // {per}) % 4 = 0 THEN 'night' ELSE 'day' END AS time_of_day,
         false AS gt_hard_brake, false AS gt_cut_in, false AS gt_pedestrian_close_call,
         false AS gt_low_lane_confidence,
         'drive.mcap' AS source_file, CAST(i AS BIGINT) AS source_offset,
         CAST(NULL AS BIGINT) AS source_chunk_offset
  FROM range({n}) t(i){order}
) TO '{path}' (FORMAT PARQUET, COMPRESSION ZSTD, ROW_GROUP_SIZE 122880{kv})
"""

# The footer key by which `ingest` says a frame file is sorted by drive and time as a
# whole (`drivetrain_steps::ingest::SORTED_BY`); DuckDB writes it with the same rows.
SORTED_KV = ", KV_METADATA {'drivetrain.sorted_by': 'drive,ts'}"


# Both engines use every core of the machine (DataFusion: one stream or partition per core).
CORES = os.cpu_count() or 1


def mine_sql():
    tagged = ", ".join(f'coalesce(({sql}), false) AS "rule_{n}"' for n, sql in RULES.items())
    names = ", ".join(f"CASE WHEN \"rule_{n}\" THEN '{n}' END" for n in RULES)
    anyr = " OR ".join(f'"rule_{n}"' for n in RULES)
    return (f"SELECT *, concat_ws(',', {names}) AS rules FROM (SELECT *, {tagged} FROM frames) AS tagged "
            f"WHERE {anyr} ORDER BY drive, ts")


PY_MINE = r'''
import duckdb, sys
con = duckdb.connect()
con.execute(f"SET threads TO {sys.argv[4]}")
con.execute(f"CREATE VIEW frames AS SELECT * FROM read_parquet('{sys.argv[1]}/*.parquet')")
con.execute(f"COPY ({sys.argv[3]}) TO '{sys.argv[2]}' (FORMAT PARQUET)")
'''


def mine(b, sizes):
    import duckdb
    print("\n| mine: 4 reference rules | table | frames | wall | rows/s | peak RSS | DataFusion ÷ DuckDB rows/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for n in sizes:
        # As `ingest` writes a frame table (its footer says it is sorted by drive and
        # time); the same order without that footer key; and the rows shuffled.
        for table, kv, order in (("sorted, declared", SORTED_KV, ""), ("sorted, undeclared", "", ""),
                                 ("shuffled", "", " ORDER BY hash(i)")):
            with tempfile.TemporaryDirectory() as tmp:
                frames = os.path.join(tmp, "frames")
                os.makedirs(frames)
                duckdb.connect().execute(GEN_SQL.format(n=n, per=36000, path=os.path.join(frames, "part-0.parquet"), kv=kv, order=order))
                duck, duck_rss = timed([sys.executable, "-c", PY_MINE, frames, os.path.join(tmp, "duck.parquet"), mine_sql(), str(CORES)])
                env = step_env(tmp, {"rules": RULES}, {"frames": frames}, {"corner_cases": os.path.join(tmp, "dt")})
                ours, ours_rss = timed([b, "step", "mine-corner-cases"], env)
                with open(os.path.join(tmp, "values.json")) as f:
                    values = json.load(f)
                duck_matched = duckdb.connect().execute(
                    f"SELECT count(*) FROM '{os.path.join(tmp, 'duck.parquet')}'").fetchone()[0]
                if duck_matched != values["matched"]:
                    sys.exit(f"DuckDB matched {duck_matched:,} frames, drivetrain {values['matched']:,}")
                streams = values.get("streams", 1)
                how = {("declared", "ordered"): f"declared order, {streams} ordered stream(s)",
                       ("checked", "ordered"): f"order checked, {streams} ordered stream(s)",
                       ("unsorted", "window keys"): f"windows first, keys joined, {CORES} partitions",
                       ("unsorted", "sort"): f"{CORES} partitions, sorted"}[(values["input_order"], values["plan"])]
                print(f"| DuckDB {duckdb.__version__} ({CORES} threads) | {table} | {n:,} | {duck:.2f} s | {n / duck / 1e6:.2f} M | {duck_rss / 1024:.0f} MiB | |")
                print(f"| drivetrain (DataFusion, {how}) | {table} | {n:,} | {ours:.2f} s | {n / ours / 1e6:.2f} M | {ours_rss / 1024:.0f} MiB | {duck / ours:.2f} |")
                print(f"|  matched (both) | | {values['matched']:,} | | | | |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=["all", "ingest", "mine"], default="all")
    ap.add_argument("--drives", type=int, default=20)
    ap.add_argument("--minutes", type=int, default=5)
    ap.add_argument("--sizes", default="2500000,5000000,10000000")
    args = ap.parse_args()
    b = binary()
    if args.suite in ("all", "ingest"):
        ingest(b, args.drives, args.minutes)
        ingest_out_of_order(b, args.drives, args.minutes)
    if args.suite in ("all", "mine"):
        mine(b, [int(s) for s in args.sizes.split(",")])


if __name__ == "__main__":
    main()
