"""What the tests against truss's own server share: serving the repository's truss, and polling."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from trtllm_truss.fronts.truss_server import TrussServer, build_server_root, start_truss_server

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 240


def serve_truss(work: Path, env: dict[str, str]) -> Iterator[TrussServer]:
    """This repository's truss under truss's real server (one thread per numeric library)."""
    fs_root = build_server_root(REPO_ROOT, work)
    proc = start_truss_server(fs_root, work / "server.log", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **env})
    try:
        proc.wait_ready(STARTUP_TIMEOUT_S)
        yield proc
    finally:
        proc.stop()


def poll(condition, timeout_s: float, interval_s: float = 0.2, what: str = "condition"):
    """`condition()`'s first truthy value, checked every `interval_s` until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} not reached within {timeout_s} s")
