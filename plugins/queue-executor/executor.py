"""The `queue` executor plugin: drivetrain's executor protocol (version 1) over a folder.

The engine runs `python3 executor.py` once per operation, a JSON request on stdin and a JSON
reply on stdout (docs/spec.md, "Executor plugins"). The folder is `$DRIVETRAIN_QUEUE`;
each attempt is a job folder `jobs/HANDLE/` holding `request.json` (what to run), then
`claim` (the worker that took it, with its pid), `log` (its ranks' output), `cancel` (asked
to stop) and `status.json` (how it ended). The handle is made of the attempt's run, stage,
attempt and item, so `start` of an attempt already queued answers its handle again: a
restarted engine re-attaches by it.
"""

import hashlib
import json
import os
import re
import socket
import sys

STATES_RUNNING = ("queued", "running")


def queue_dir():
    d = os.environ.get("DRIVETRAIN_QUEUE")
    if not d:
        sys.exit("DRIVETRAIN_QUEUE names no folder: set it to the queue the workers read")
    os.makedirs(os.path.join(d, "jobs"), exist_ok=True)
    return d


def job_dir(handle):
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", handle or "") or handle.startswith("."):
        raise ValueError(f"not a handle: {handle!r}")
    return os.path.join(queue_dir(), "jobs", handle)


def handle_of(a):
    key = f"{a['run']}/{a['stage']}/{a['attempt']}/{a.get('item')}"
    readable = re.sub(r"[^A-Za-z0-9-]", "-", f"{a['stage']}-{a['attempt']}")[:60]
    return f"{readable}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def write_atomic(path, data):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def state_of(handle):
    d = job_dir(handle)
    if not os.path.isdir(d):
        return {"state": "unknown"}
    status = os.path.join(d, "status.json")
    if os.path.exists(status):
        with open(status) as f:
            return json.load(f)
    claim = os.path.join(d, "claim")
    if not os.path.exists(claim):
        return {"state": "queued"}
    try:
        with open(claim) as f:
            c = json.load(f)
        pid = int(c["pid"])
    except (ValueError, KeyError, OSError):
        return {"state": "running"}
    # A worker on another machine is asked nothing here: its job runs until it says.
    if c.get("host", socket.gethostname()) != socket.gethostname() or pid_alive(pid):
        return {"state": "running"}
    # The worker died with the job: its processes went with it (their own session, killed
    # by the worker's death watch) or are orphans no one watches.
    if os.path.exists(status):
        with open(status) as f:
            return json.load(f)
    return {"state": "lost", "reason": f"the worker (pid {pid}) that took the job is gone"}


def start(req):
    a = req["attempt"]
    handle = handle_of(a)
    d = job_dir(handle)
    try:
        os.mkdir(d)
    except FileExistsError:
        return {"handle": handle}
    write_atomic(os.path.join(d, "request.json"), a)
    return {"handle": handle}


def poll(req):
    return {"attempts": {h: state_of(h) for h in req["handles"]}}


def logs(req):
    path = os.path.join(job_dir(req["handle"]), "log")
    offset = int(req.get("offset", 0))
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(1 << 20)
    except FileNotFoundError:
        data = b""
    return {"text": data.decode("utf-8", "replace"), "offset": offset + len(data)}


def cancel(req):
    handle = req["handle"]
    d = job_dir(handle)
    if not os.path.isdir(d) or state_of(handle)["state"] not in STATES_RUNNING:
        return {"running": False}
    open(os.path.join(d, "cancel"), "w").close()
    # A job no worker took yet ends here; a worker that claims it after sees `cancel`.
    if not os.path.exists(os.path.join(d, "claim")):
        try:
            fd = os.open(os.path.join(d, "claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, json.dumps({"pid": os.getpid(), "cancelled": True}).encode())
            os.close(fd)
            write_atomic(os.path.join(d, "status.json"), {"state": "cancelled"})
        except FileExistsError:
            pass
    return {"running": True}


def find(req):
    handle = handle_of({"run": req["run"], "stage": req["stage"], "attempt": req["attempt"], "item": None})
    return {"handle": handle if os.path.isdir(job_dir(handle)) else None}


OPS = {"start": start, "poll": poll, "logs": logs, "cancel": cancel, "find": find}


def main():
    req = json.load(sys.stdin)
    if req.get("protocol") != 1:
        sys.exit(f"protocol {req.get('protocol')} is not this plugin's (1)")
    op = OPS.get(req.get("op"))
    if op is None:
        sys.exit(f"unknown op {req.get('op')!r}")
    json.dump(op(req), sys.stdout)


if __name__ == "__main__":
    main()
