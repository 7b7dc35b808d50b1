"""What the tests against truss's own server share: serving the repository's truss (under truss's server
or the direct front), and polling."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from trtllm_truss.fronts.direct import start_direct_server
from trtllm_truss.fronts.truss_server import TrussServer, build_server_root, start_truss_server

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 240
FRONTS = ("truss", "direct")
# The direct front's processes in the tests: two, so every guarantee is seen across processes.
DIRECT_FRONTENDS = "2"
RUNNING: dict[int, TrussServer] = {}  # id -> started here, not stopped yet (conftest stops a module's at once)


def serve_truss(work: Path, env: dict[str, str], startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[TrussServer]:
    """This repository's truss under truss's real server (one thread per numeric library)."""
    fs_root = build_server_root(REPO_ROOT, work)
    proc = start_truss_server(fs_root, work / "server.log", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **env})
    RUNNING[id(proc)] = proc
    try:
        proc.wait_ready(startup_timeout_s)
        yield proc
    finally:
        proc.stop()
        RUNNING.pop(id(proc), None)


def serve_front(front: str, work: Path, env: dict[str, str]) -> Iterator[TrussServer]:
    """This repository's truss under truss's server (`truss`) or the direct front (`direct`)."""
    env = {"TRTLLM_RUNTIME__STORE__PATH": str(work / "store.sqlite3"), **env}  # stored responses: the test's own
    if front == "truss":
        for proc in serve_truss(work, env):
            proc.front = front
            yield proc
        return
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES": DIRECT_FRONTENDS,
           **env}
    proc = start_direct_server(REPO_ROOT, work / "direct.log", env=env)
    proc.front = front
    RUNNING[id(proc)] = proc
    try:
        proc.wait_ready(STARTUP_TIMEOUT_S)
        yield proc
    finally:
        proc.stop()
        RUNNING.pop(id(proc), None)


def poll(condition, timeout_s: float, interval_s: float = 0.2, what: str = "condition"):
    """`condition()`'s first truthy value, checked every `interval_s` until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def front_ready(url: str) -> bool:
    """The front at `url` answers 200 on /health/ready (False while it refuses or does not listen yet)."""
    try:
        return httpx.get(url + "/health/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def fleet_instances(server: TrussServer) -> dict[int, str]:
    """A fleet's replica index -> its Dynamo instance id now (what `x-replica` names it by), from the replicas'
    "in the fleet" log lines (a restarted replica logs a new one)."""
    found = {}
    for match in re.finditer(r"replica (\d+) in the fleet \(Dynamo instance (\d+)\)", server.log_path.read_text(errors="replace")):
        found[int(match.group(1))] = match.group(2)
    return found


def fleet_replica_pids(server: TrussServer) -> dict[int, int]:
    """A fleet's replica index -> the pid of its process now (the latest "in the fleet" line per index)."""
    found = {}
    for match in re.finditer(r"\[fleet replica (\d+)\] INFO replica (\d+) in the fleet", server.log_path.read_text(errors="replace")):
        found[int(match.group(2))] = int(match.group(1))
    return found


class RestartableDirectFront:
    """The direct front of this repository's truss on `env` (a store file, say), started at once; `restart()`
    stops it and starts it again on the same settings, each start logging to `work`/direct-N.log."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work = work
        self.env = env
        self.starts = 0
        self.proc: TrussServer | None = None
        self.start()

    def start(self) -> None:
        self.starts += 1
        proc = start_direct_server(REPO_ROOT, self.work / f"direct-{self.starts}.log", env=self.env)
        self.proc = proc
        poll(lambda: proc.process.poll() is not None or front_ready(proc.url), STARTUP_TIMEOUT_S, what="direct front ready")
        assert proc.process.poll() is None, proc.log_tail()

    def restart(self) -> None:
        self.proc.stop()
        self.start()

    @property
    def url(self) -> str:
        return self.proc.url
