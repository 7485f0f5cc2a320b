"""A PostgreSQL cluster of its own for the benchmarks (`bench/storage.py`,
`bench/keyed_load.py`): Debian's `initdb` and `pg_ctl`, trust auth, a loopback port;
as `nobody` when run as root (initdb refuses root)."""
import os
import shutil
import socket
import subprocess


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_postgres(work, options=""):
    """A PostgreSQL cluster of its own on a loopback port; its URL and a stop function."""
    pg_bin = next((os.path.dirname(p) for p in [shutil.which("pg_ctl")] if p), None) or sorted(
        os.path.join("/usr/lib/postgresql", v, "bin") for v in os.listdir("/usr/lib/postgresql")
    )[-1]
    data = os.path.join(work, "pg")
    as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] if os.geteuid() == 0 else []
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "nobody:nogroup", work], check=True)
    subprocess.run(
        as_user + [os.path.join(pg_bin, "initdb"), "-A", "trust", "-U", "postgres", "-D", data],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    port = free_port()
    options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={work} {options}"
    subprocess.run(
        as_user + [os.path.join(pg_bin, "pg_ctl"), "-D", data, "-l", os.path.join(work, "pg.log"), "-o", options, "-w", "start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )

    def stop():
        subprocess.run(as_user + [os.path.join(pg_bin, "pg_ctl"), "-D", data, "-m", "fast", "stop"], stdout=subprocess.DEVNULL)

    return f"postgres://postgres@127.0.0.1:{port}/postgres", stop


