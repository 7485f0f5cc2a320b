#!/usr/bin/env python3
"""Fleet logs as fleets write them (issue 48): decoding speed against the Python readers,
and memory bounds at scale.

  decode:  `fleet-sim` logs written as protobuf and as ROS 2 (CDR), `drivetrain step ingest`
           against the Python readers (mcap-protobuf-support's and mcap-ros2-support's
           decoders) decoding the same files and assembling the same frames with pyarrow.
           Frames per second, same files, same run.
  reorder: one log of SIZE MB (uncompressed JSON messages, 100 Hz `/vehicle` and `/lane`)
           written in time order, and the same with one `/vehicle` message out of order at
           its end; ingest's wall time and peak RSS for each (the out-of-order log is put in
           order within `reorder_memory`, 64 MiB by default).
  drives:  N tiny drives (fleet-sim, 2 s each): ingest, then mining with the reference
           rules; peak RSS of each, at two sizes, so the growth per drive partition shows.

Needs a release build (`cargo build --release`) and the tests' venv (`.ci/run` makes it:
mcap, mcap-protobuf-support, mcap-ros2-support, pyarrow):
  ~/.cache/drivetrain/venv/bin/python bench/fleet_logs.py [--suite decode|reorder|drives|all]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from steps import RULES, binary, step_env, timed  # noqa: E402

PY_DECODE = r'''
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory as Proto
from mcap_ros2.decoder import DecoderFactory as Ros2
src, out = sys.argv[1], sys.argv[2]
F64 = ["speed_mps","accel_x","accel_y","yaw_rate","steering","brake_pressure","lat","lon"]
HELD = {"/lane": ("lane_age_s", ["lateral_offset_m", "lane_confidence"]),
        "/objects": ("objects_age_s", ["class", "distance_m", "rel_speed_mps"]),
        "/context": ("context_age_s", ["weather", "time_of_day"]),
        "/ground_truth": ("ground_truth_age_s", ["hard_brake", "cut_in", "pedestrian_close_call", "low_lane_confidence"])}
frames = 0
for name in sorted(os.listdir(src)):
    drive = name.rsplit(".", 1)[0]
    cols = {c: [] for c in ["drive", "ts", "log_time_ns", *F64]}
    for topic, (age, fields) in HELD.items():
        cols[age] = []
        for f in fields: cols[topic + "." + f] = []
    held, since, first = {}, {}, None
    with open(os.path.join(src, name), "rb") as f:
        reader = make_reader(f, decoder_factories=[Proto(), Ros2()])
        for schema, channel, message, obj in reader.iter_decoded_messages():
            t = channel.topic
            if t == "/vehicle":
                first = message.log_time if first is None else first
                cols["drive"].append(drive); cols["ts"].append((message.log_time - first) / 1e9)
                cols["log_time_ns"].append(message.log_time)
                for c in F64: cols[c].append(getattr(obj, c))
                for topic, (age, fields) in HELD.items():
                    cols[age].append((message.log_time - since[topic]) / 1e9 if topic in since else None)
                    for fl in fields: cols[topic + "." + fl].append(held.get(topic + "." + fl))
            elif t in HELD:
                for fl in HELD[t][1]: held[t + "." + fl] = getattr(obj, fl)
                since[t] = message.log_time
    frames += len(cols["drive"])
    d = os.path.join(out, f"drive={drive}"); os.makedirs(d, exist_ok=True)
    pq.write_table(pa.table(cols), os.path.join(d, "part-00000.parquet"), compression="zstd")
print(frames)
'''


def simulate(b, tmp, drives, minutes, rate, encoding, name="logs"):
    logs = os.path.join(tmp, name)
    cfg = {"drives": drives, "duration": minutes, "rate_hz": rate, "seed": 1, "encoding": encoding}
    subprocess.run([b, "step", "fleet-sim"], env=step_env(tmp, cfg, {}, {"logs": logs}), check=True,
                   stdout=subprocess.DEVNULL)
    return logs


def decode(b, drives, minutes):
    print(f"\ndecode: {drives} drives × {minutes} min at 20 Hz, fleet-sim, zstd chunks")
    print("\n| encoding | MB | frames | python readers + pyarrow | drivetrain step ingest | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for encoding in ["protobuf", "ros2"]:
        with tempfile.TemporaryDirectory() as tmp:
            logs = simulate(b, tmp, drives, f"{minutes}m", 20, encoding)
            mb = sum(os.path.getsize(os.path.join(logs, f)) for f in os.listdir(logs)) / 1e6
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", PY_DECODE, logs, os.path.join(tmp, "py")],
                                 check=True, capture_output=True, text=True)
            py = time.perf_counter() - start
            py_frames = int(out.stdout.strip())
            frames = os.path.join(tmp, "frames")
            wall, _ = timed([b, "step", "ingest"], step_env(tmp, {}, {"logs": logs}, {"frames": frames}))
            values = json.load(open(os.path.join(tmp, "values.json")))
            if values["frames"] != py_frames or values["undecodable_messages_total"] != 0:
                sys.exit(f"{encoding}: {values['frames']} frames against python's {py_frames}")
            print(f"| {encoding} | {mb:.1f} | {py_frames:,} | {py:.2f} s ({py_frames / py:,.0f} frames/s) | "
                  f"{wall:.2f} s ({py_frames / wall:,.0f} frames/s) | **{py / wall:.1f}×** |")


GEN_BIG = r'''
import json, os, random, sys
from mcap.writer import Writer, CompressionType
path, mb, late = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
rng = random.Random(3)
pad = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(600))
t0 = 1_767_254_400_000_000_000
with open(path, "wb") as f:
    w = Writer(f, chunk_size=4 << 20, compression=CompressionType.NONE)
    w.start(profile="", library="bench big log")
    s = w.register_schema(name="x", encoding="jsonschema", data=b"{}")
    v = w.register_channel(topic="/vehicle", message_encoding="json", schema_id=s)
    l = w.register_channel(topic="/lane", message_encoding="json", schema_id=s)
    i, size = 0, 0
    while size < mb << 20:
        t = t0 + i * 10_000_000
        vd = json.dumps({"speed_mps": i % 30 + 0.5, "accel_x": -1.0, "note": pad[i % 50:]}).encode()
        ld = json.dumps({"lane_confidence": 0.9, "note": pad[i % 70:]}).encode()
        w.add_message(channel_id=v, log_time=t, publish_time=t, data=vd)
        w.add_message(channel_id=l, log_time=t + 1, publish_time=t + 1, data=ld)
        size += len(vd) + len(ld) + 60
        i += 1
    if late:
        # One message out of time order, at the very end of the log.
        w.add_message(channel_id=v, log_time=t0 + 5, publish_time=t0 + 5, data=b'{"speed_mps": 1.0}')
    w.finish()
print(i + (1 if late else 0))
'''


def reorder(b, mb):
    print(f"\nreorder: one log of about {mb} MB (JSON, uncompressed chunks), in order and with one message late")
    print("\n| log | MB | frames | reordered | runs on disk | wall | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for label, late in [("in order", "0"), ("one message late", "1")]:
            logs = os.path.join(tmp, "logs")
            os.makedirs(logs, exist_ok=True)
            path = os.path.join(logs, "big.mcap")
            frames_written = int(subprocess.run([sys.executable, "-c", GEN_BIG, path, str(mb), late],
                                                check=True, capture_output=True, text=True).stdout)
            size = os.path.getsize(path) / 1e6
            frames = os.path.join(tmp, "frames")
            wall, rss = timed([b, "step", "ingest"], step_env(tmp, {}, {"logs": logs}, {"frames": frames}))
            values = json.load(open(os.path.join(tmp, "values.json")))
            if values["frames"] != frames_written:
                sys.exit(f"{label}: {values['frames']} frames of {frames_written}")
            print(f"| {label} | {size:,.0f} | {values['frames']:,} | {len(values['reordered'])} | "
                  f"{values['reorder_runs']} | {wall:.1f} s | {rss / 1024:.0f} MiB |")
            subprocess.run(["rm", "-rf", logs, frames])


REVERSE = r'''
import os, sys
import pyarrow.parquet as pq
src, dst = sys.argv[1], sys.argv[2]
for d in sorted(os.listdir(src)):
    os.makedirs(os.path.join(dst, d))
    t = pq.read_table(os.path.join(src, d, "part-00000.parquet"))
    pq.write_table(t.take(list(range(t.num_rows - 1, -1, -1))).replace_schema_metadata(None),
                   os.path.join(dst, d, "part-00000.parquet"))
'''


def drives(b, sizes):
    print("\ndrives: fleet-sim drives of 2 s at 10 Hz (20 frames each), ingest then the reference rules;")
    print("then the same frames with each file's rows reversed and no order in its footer (unsorted)")
    print("\n| drives | ingest wall | ingest peak RSS | mine wall | mine peak RSS | mined frames | "
          "unsorted: plan | mine wall | mine peak RSS |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            logs = simulate(b, tmp, n, "2s", 10, "json")
            frames = os.path.join(tmp, "frames")
            iw, irss = timed([b, "step", "ingest"], step_env(tmp, {}, {"logs": logs}, {"frames": frames}))
            mined = []
            for table in (frames, os.path.join(tmp, "reversed")):
                if table != frames:
                    subprocess.run([sys.executable, "-c", REVERSE, frames, table], check=True)
                out = os.path.join(tmp, "cc" + str(len(mined)))
                mw, mrss = timed([b, "step", "mine-corner-cases"],
                                 step_env(tmp, {"rules": RULES}, {"frames": table}, {"corner_cases": out}))
                values = json.load(open(os.path.join(tmp, "values.json")))
                mined.append((mw, mrss, values))
            (mw, mrss, values), (uw, urss, unsorted) = mined
            if values["rules"] != unsorted["rules"] or unsorted["input_order"] != "unsorted":
                sys.exit(f"the unsorted table mined otherwise: {values} against {unsorted}")
            print(f"| {n:,} | {iw:.1f} s | {irss / 1024:.0f} MiB | {mw:.1f} s | {mrss / 1024:.0f} MiB | "
                  f"{values['frames']:,} | {unsorted['plan']} | {uw:.1f} s | {urss / 1024:.0f} MiB |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=["all", "decode", "reorder", "drives"], default="all")
    ap.add_argument("--drives", type=int, default=10, help="decode: drives of fleet-sim")
    ap.add_argument("--minutes", type=int, default=5, help="decode: minutes per drive")
    ap.add_argument("--mb", type=int, default=2048, help="reorder: size of the log")
    ap.add_argument("--partitions", default="1000,10000", help="drives: numbers of tiny drives")
    args = ap.parse_args()
    b = binary()
    if args.suite in ("all", "decode"):
        decode(b, args.drives, args.minutes)
    if args.suite in ("all", "reorder"):
        reorder(b, args.mb)
    if args.suite in ("all", "drives"):
        drives(b, [int(s) for s in args.partitions.split(",")])


if __name__ == "__main__":
    main()
