"""A throwaway PostgreSQL server for tests: Debian's binaries (`initdb`, `pg_ctl`; scripts/bootstrap.sh
installs the `postgresql` package) on a temporary folder, listening on loopback only. As root the
server runs as the `postgres` user (initdb refuses root). `postgres_binaries()` is None where the
binaries are absent: the tests that need them skip."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def postgres_binaries() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def postgres_server(work: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """A running server on `work`; yields its connection string; stopped (fast) at the end."""
    bin_dir = postgres_binaries()
    assert bin_dir is not None, "PostgreSQL binaries are not installed"
    as_user: list[str] = []
    if os.geteuid() == 0:
        # The server's user must reach its folder: pytest's are under root's 0700 folder.
        user = pwd.getpwnam("postgres")
        work = Path(tempfile.mkdtemp(prefix="trtllm-truss-postgres-"))
        os.chown(work, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data = work / "pgdata"
    port = _free_port()
    log = work / "postgres.log"
    _run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "store", "-A", "trust", "--no-sync"], timeout_s)
    options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories='' -c fsync=off"
    _run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w",
          "-t", str(int(timeout_s)), "start"], timeout_s + 10)
    try:
        url = f"postgresql://store@127.0.0.1:{port}/postgres"
        _wait_accepting(url, timeout_s)
        yield url
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=timeout_s)
        if as_user:
            shutil.rmtree(work, ignore_errors=True)


def _run(command: list[str], timeout_s: float) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{command[-1]}: {done.stdout}{done.stderr}"


def _wait_accepting(url: str, timeout_s: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # polling a server's start, with a deadline
