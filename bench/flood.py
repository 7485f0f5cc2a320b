#!/usr/bin/env python3
"""`drivetrain serve` under a flood (bench/README.md, "serve under a flood"): what
tests/it/flood.rs checks, with the figures.

Makes a home of 5,400 runs, starts the binary's `serve` on it with at most 1,024 open
files (soft and hard), then:
0. opens 200 run-list streams from four loopback addresses and measures the share of a
   core the server spends on them, idle, over 5 s; closes them;
1. opens 1,100 connections that each send half a request head and nothing more;
2. asks for 2,000 streams of `GET /api/v1/events`, from this one client;
3. times 50 `GET /healthz` and 50 `GET /api/v1/runs` while all of that is open;
4. closes everything and samples the server's RSS for 30 s (the start: after one
   request of each kind, which fault in code and fill caches).
Prints the latencies (median, p99, max), the streams served and refused, and the RSS
before, at the peak and after. Standard library only; needs a hard limit of at least
3,400 open files for this process. Usage: bench/flood.py [BINARY [REQUESTS]]  (REQUESTS of each kind, default 50)
"""
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

IDLE, STREAMS, TOKEN = 1100, 2000, "bench-token"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def get(addr, path, token=None, within=5):
    """Seconds until a 200 came back, or None: no answer within `within` seconds."""
    start = time.perf_counter()
    try:
        with socket.create_connection(addr, timeout=within) as c:
            head = f"GET {path} HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\nConnection: close\r\n"
            if token:
                head += f"Authorization: Bearer {token}\r\n"
            c.sendall((head + "\r\n").encode())
            data = b""
            while chunk := c.recv(65536):
                data += chunk
    except OSError:
        return None
    took = time.perf_counter() - start
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return took


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_streams_cpu(server, addr, n=200, clients=4):
    """The share of a core `n` open, idle run-list streams cost the server, from `clients`
    loopback addresses (each within the per-client bound), over 5 s."""
    ask = (f"GET /api/v1/events HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\n"
           f"Authorization: Bearer {TOKEN}\r\n\r\n").encode()
    streams = []
    for i in range(n):
        c = socket.socket()
        c.bind((f"127.0.0.{2 + i % clients}", 0))
        c.connect(addr)
        c.sendall(ask)
        streams.append(c)
    time.sleep(1)
    before = cpu_seconds(server.pid)
    time.sleep(5)
    used = (cpu_seconds(server.pid) - before) / 5
    served = 0
    for c in streams:
        c.settimeout(0.5)
        try:
            served += c.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            pass
        c.close()
    print(f"{n} idle streams ({served} served): {used:.2f} of a core")


def figures(name, took):
    answered = sorted(t * 1000 for t in took if t is not None)
    missing = len(took) - len(answered)
    if not answered:
        print(f"{name}: no answer within 5 s to any of {len(took)} requests")
        return
    print(f"{name}: median {statistics.median(answered):.2f} ms, p99 {answered[int(len(answered) * 0.99)]:.2f} ms, "
          f"max {answered[-1]:.2f} ms ({len(answered)} requests; {missing} unanswered within 5 s)")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/drivetrain"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE + STREAMS + 300), hard))
    home = tempfile.mkdtemp(prefix="dt-flood-")
    # A home of 5,400 runs, as where the issue measured (bench/run_list.py writes them).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run_list
    run_list.RUNS = 5400
    run_list.make_home(os.path.abspath(binary), home)
    os.mkdir(os.path.join(home, "served"))
    with open(os.path.join(home, "served", "hello.yaml"), "w") as f:
        f.write('version: 1\nname: hello\nstages:\n  a:\n    run: {command: ["true"]}\n')
    server = subprocess.Popen(
        ["sh", "-c", 'ulimit -n 1024 && exec "$0" "$@"', os.path.abspath(binary),
         "serve", "--pipelines", "served", "--bind", "127.0.0.1:0", "--token", TOKEN],
        cwd=home, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in server.stdout:
            if line.startswith("listening on http://"):
                host, port = line.strip().removeprefix("listening on http://").rsplit(":", 1)
                addr = (host, int(port))
                break
        # Warm: the first of each kind of request faults in code and fills caches.
        for path, token in (("/healthz", None), ("/api/v1/runs", TOKEN), ("/metrics", TOKEN)):
            get(addr, path, token)
        with socket.create_connection(addr) as c:
            c.sendall((f"GET /api/v1/events HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\n"
                       f"Authorization: Bearer {TOKEN}\r\n\r\n").encode())
            c.recv(4096)
        time.sleep(1)
        idle_streams_cpu(server, addr)
        time.sleep(1)
        before = rss_kib(server.pid)
        held, refused_connects = [], 0

        def connect(first_bytes):
            nonlocal refused_connects
            try:
                c = socket.create_connection(addr, timeout=2)
                c.sendall(first_bytes)
                return c
            except OSError:
                refused_connects += 1
                return None

        # A server that no longer accepts fills its listen queue; after 20 connections
        # not made, the flood stops growing.
        for _ in range(IDLE):
            if refused_connects >= 20:
                break
            if c := connect(b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n"):
                held.append(c)
        ask = (f"GET /api/v1/events HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\n"
               f"Authorization: Bearer {TOKEN}\r\n\r\n").encode()
        streams = []
        for _ in range(STREAMS):
            if refused_connects >= 20:
                break
            if c := connect(ask):
                streams.append(c)
        if refused_connects:
            print(f"{refused_connects} of the flood's connections not made within 2 s")
        figures("GET /healthz", [get(addr, "/healthz") for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 50)])
        figures("GET /api/v1/runs", [get(addr, "/api/v1/runs", TOKEN) for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 50)])
        served = refused = 0
        for c in streams:
            c.settimeout(0.2)
            try:
                first = c.recv(64)
            except OSError:
                first = b""
            served += first.startswith(b"HTTP/1.1 200")
            refused += first.startswith(b"HTTP/1.1 503")
        print(f"streams: {served} served, {refused} refused with 503, "
              f"{len(streams) - served - refused} closed or unanswered")
        peak = rss_kib(server.pid)
        for c in held + streams:
            c.close()
        samples = []
        for _ in range(30):
            time.sleep(1)
            samples.append(rss_kib(server.pid))
        print(f"RSS: {before / 1024:.1f} MiB before, {peak / 1024:.1f} MiB during, "
              f"{samples[4] / 1024:.1f} / {samples[9] / 1024:.1f} / {samples[-1] / 1024:.1f} MiB "
              f"5 / 10 / 30 s after the flood closed ({samples[-1] / before:.2f}× the start)")
    finally:
        server.terminate()
        server.wait()
        subprocess.run(["rm", "-rf", home])


if __name__ == "__main__":
    main()
