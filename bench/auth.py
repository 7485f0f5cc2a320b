#!/usr/bin/env python3
"""What authorization costs per API request (see README.md here, "Authorization").

Three `drivetrain serve` processes on loopback, each with a home of its own, measured in
the same run, round after round, one after the other:
  - `open`:  no token anywhere, `--insecure-no-auth`: each request is the anonymous
             subject (the rule of its route is still decided): the baseline;
  - `token`: a token of the state store (`drivetrain token create`): SHA-256 of the bearer
             token, one SQLite lookup, the decision;
  - `oidc`:  an OpenID Connect ID token (RS256, made by PyJWT, keys served by
             tests/people/issuer.py), verified on every request (the issuer's keys cached).
Two routes: `GET /api/v1/whoami` (the handler does nearly nothing: the figure is the
authentication layer) and `POST /api/v1/runs/UNKNOWN/cancel` (answered 404 after the
layer has decided and appended the request to the audit log: one more SQLite write).
Requests are sequential on one kept-alive connection; the figure is the median latency of
`--requests` requests per route, per server, per round, and the median over rounds.

  cargo build --release --bin drivetrain
  ~/.cache/drivetrain/venv/bin/python bench/auth.py [--requests 2000] [--rounds 5]
"""

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
VENV = os.path.expanduser("~/.cache/drivetrain/venv/bin")
BIN = os.path.join(TARGET, "release", "drivetrain")
HELLO = 'version: 1\nname: hello\nstages:\n  a:\n    run: {command: ["true"]}\n'


def home(name):
    d = tempfile.mkdtemp(prefix=f"bench-auth-{name}-")
    os.makedirs(os.path.join(d, "served"))
    with open(os.path.join(d, "served", "hello.yaml"), "w") as f:
        f.write(HELLO)
    return d


def serve(d, extra):
    p = subprocess.Popen([BIN, "serve", "--pipelines", "served", "--bind", "127.0.0.1:0", *extra],
                         cwd=d, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("DRIVETRAIN_")})
    for line in p.stdout:
        if line.startswith("listening on http://"):
            return p, line.strip().removeprefix("listening on http://")
    raise SystemExit("serve did not start")


RECONNECTS = [0]


def timed(addr, method, path, token, n):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port))
    headers = {"Host": addr, "Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = "{}" if method == "POST" else None
    took = []
    while len(took) < n:
        t = time.perf_counter()
        try:
            c.request(method, path, body=body, headers=headers)
            r = c.getresponse()
            r.read()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed the kept-alive connection: counted, not timed.
            RECONNECTS[0] += 1
            c.close()
            c = http.client.HTTPConnection(host, int(port))
            continue
        took.append(time.perf_counter() - t)
        if r.status not in (200, 404):
            raise SystemExit(f"{method} {path}: {r.status}")
    c.close()
    return statistics.median(took) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    homes = {k: home(k) for k in ("open", "token", "oidc")}
    t = subprocess.run([BIN, "token", "create", "--role", "admin", "--name", "bench"],
                       cwd=homes["token"], capture_output=True, text=True, check=True)
    secret = t.stdout.strip()
    issuer = subprocess.Popen([os.path.join(VENV, "python"), os.path.join(ROOT, "tests/people/issuer.py")],
                              stdout=subprocess.PIPE, text=True)
    base = issuer.stdout.readline().strip().removeprefix("listening on ")
    with open(os.path.join(homes["oidc"], "oidc.yaml"), "w") as f:
        f.write(f"issuer: {base}\naudience: drivetrain\nroles:\n  - {{group: eng, role: admin}}\n")
    host, port = base.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port))
    c.request("GET", "/mint?groups=eng&exp=3600")
    jwt = c.getresponse().read().decode()
    servers = {
        "open": serve(homes["open"], ["--insecure-no-auth"]),
        "token": serve(homes["token"], []),
        "oidc": serve(homes["oidc"], ["--oidc", "oidc.yaml"]),
    }
    tokens = {"open": None, "token": secret, "oidc": jwt}
    routes = [("GET", "/api/v1/whoami"), ("POST", "/api/v1/runs/20990101-000000-00000000/cancel")]
    results = {(s, r): [] for s in servers for r in routes}
    try:
        for name, (proc, addr) in servers.items():  # warm up: keys fetched, statements prepared
            if proc.poll() is not None:
                raise SystemExit(f"serve `{name}` exited: {proc.returncode}")
            for m, p in routes:
                timed(addr, m, p, tokens[name], 200)
        for _ in range(a.rounds):
            for m, p in routes:
                for name, (_, addr) in servers.items():
                    results[(name, (m, p))].append(timed(addr, m, p, tokens[name], a.requests))
    finally:
        for p, _ in servers.values():
            p.terminate()
        issuer.terminate()
        for d in homes.values():
            shutil.rmtree(d, ignore_errors=True)
    print(f"{a.requests} sequential requests per route, server and round; {a.rounds} rounds; median of rounds"
          f" ({RECONNECTS[0]} connections closed by a server and opened again, untimed)")
    print(f"{'route':<52} {'open µs':>9} {'token µs':>9} {'oidc µs':>9} {'token/open':>11} {'oidc/open':>10}")
    for m, p in routes:
        med = {s: statistics.median(results[(s, (m, p))]) for s in servers}
        print(f"{m + ' ' + p:<52} {med['open']:>9.1f} {med['token']:>9.1f} {med['oidc']:>9.1f}"
              f" {med['token'] / med['open']:>11.2f} {med['oidc'] / med['open']:>10.2f}")


if __name__ == "__main__":
    sys.exit(main())
