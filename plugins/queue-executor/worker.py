"""A worker of the `queue` executor plugin: takes queued jobs from `$DRIVETRAIN_QUEUE`
(or its first argument), runs each job's ranks (one process each, in a session of their
own, with exactly the job's environment, output appended to the job's `log`), stops them
all when one fails or `cancel` appears, and writes `status.json`.

    python3 worker.py [QUEUE] [--slots N]

Jobs are claimed with an exclusive create of `claim`, so workers on several machines
sharing the folder never run one job twice.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from executor import write_atomic


def claim(d):
    try:
        fd = os.open(os.path.join(d, "claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
    os.close(fd)
    return True


def stop(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def run(d):
    with open(os.path.join(d, "request.json")) as f:
        a = json.load(f)
    if os.path.exists(os.path.join(d, "cancel")):
        return {"state": "cancelled"}
    log = open(os.path.join(d, "log"), "ab")
    procs = []
    for rank_env in a["ranks"] or [[]]:
        env = dict(a["env"])
        env.update(dict(rank_env))
        try:
            procs.append(subprocess.Popen(a["argv"], env=env, cwd=a["workdir"], stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        except FileNotFoundError:
            stop(procs)
            return {"state": "failed", "exit_code": 127, "reason": f"{a['argv'][0]}: command not found"}
        except OSError as e:
            stop(procs)
            return {"state": "failed", "exit_code": 126, "reason": f"{a['argv'][0]}: {e.strerror}"}
    while True:
        if os.path.exists(os.path.join(d, "cancel")):
            stop(procs)
            return {"state": "cancelled"}
        codes = [p.poll() for p in procs]
        bad = [c for c in codes if c not in (None, 0)]
        if bad:
            stop(procs)
            code = bad[0]
            reason = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            return {"state": "failed", "exit_code": code if code > 0 else None, "reason": reason}
        if all(c == 0 for c in codes):
            return {"state": "succeeded", "exit_code": 0}
        time.sleep(0.02)


def work(d):
    try:
        status = run(d)
    except Exception as e:  # what the worker cannot run is the job's failure, said
        status = {"state": "failed", "reason": f"the worker could not run the job: {e}"}
    write_atomic(os.path.join(d, "status.json"), status)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    slots = 4
    if "--slots" in sys.argv:
        slots = int(sys.argv[sys.argv.index("--slots") + 1])
        args = [a for a in args if a != str(slots)]
    queue = args[0] if args else os.environ["DRIVETRAIN_QUEUE"]
    jobs = os.path.join(queue, "jobs")
    os.makedirs(jobs, exist_ok=True)
    busy = []
    while True:
        busy = [t for t in busy if t.is_alive()]
        for name in sorted(os.listdir(jobs)):
            d = os.path.join(jobs, name)
            if len(busy) >= slots:
                break
            ready = os.path.exists(os.path.join(d, "request.json"))
            if ready and not os.path.exists(os.path.join(d, "claim")) and claim(d):
                t = threading.Thread(target=work, args=(d,), daemon=True)
                t.start()
                busy.append(t)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
