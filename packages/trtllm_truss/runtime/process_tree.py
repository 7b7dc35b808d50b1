"""Linux /proc process-tree helpers: session members, children, kill sweeps, leftover shm regions.

Used to stop everything a tritonserver session started (python backend stubs, MPI ranks), not just its leader.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path


# ----------------------------------------------------------------------------------------- processes


def _live_processes() -> list[tuple[int, int, int]]:
    """(pid, ppid, session id) of every process that is not a zombie (Linux /proc)."""
    processes = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        # Fields after the command name (which may contain spaces): state ppid pgrp session ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 3 and fields[0] != "Z":
            processes.append((int(entry.name), int(fields[1]), int(fields[3])))
    return processes


def _session_members(session_id: int) -> list[int]:
    """PIDs whose session is `session_id`. The child is a session leader, so this is its whole tree."""
    return [pid for pid, _, session in _live_processes() if session == session_id]


def _children_of(pid: int) -> list[int]:
    return [child for child, parent, _ in _live_processes() if parent == pid]


def _kill_session(session_id: int, sig: signal.Signals) -> int:
    """Send `sig` to every process of the session; returns how many were signalled."""
    count = 0
    for pid in _session_members(session_id):
        try:
            os.kill(pid, sig)
            count += 1
        except ProcessLookupError:
            pass
    return count


def _kill_session_and_wait(session_id: int, timeout_s: float = 5.0) -> None:
    """SIGKILL the session and wait until none of it is left (orphans are reaped by init)."""
    deadline = time.monotonic() + timeout_s
    while _kill_session(session_id, signal.SIGKILL) and time.monotonic() < deadline:
        time.sleep(0.05)


def _remove_shm_regions(prefix: str) -> None:
    """Python backend shm regions a killed server could not unlink."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return
    for region in shm.glob(f"{prefix}*"):
        try:
            region.unlink()
        except OSError:
            pass


# ------------------------------------------------------------------------------- python-backend stubs

STUB_EXECUTABLE = "triton_python_backend_stub"


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


@dataclass(frozen=True)
class StubProcess:
    pid: int
    start_time: int  # clock ticks after boot (/proc/<pid>/stat field 22): tells a reused pid apart
    model: str  # from its command line `<repository>/<model>/<version>/model.py ...`
    parent: int  # the tritonserver (rank) that started it
    parent_start_time: int


def python_stubs(session_id: int) -> list[StubProcess]:
    """The python-backend stubs of a tritonserver session (every local rank's)."""
    stubs = []
    for pid, ppid, session in _live_processes():
        if session != session_id:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if not argv or Path(argv[0].decode(errors="replace")).name != STUB_EXECUTABLE:
            continue
        fields, parent_fields = _stat_fields(pid), _stat_fields(ppid)
        if fields is None or parent_fields is None or len(fields) < 20 or len(parent_fields) < 20:
            continue
        model_path = Path(argv[1].decode(errors="replace")) if len(argv) > 1 else Path()
        model = model_path.parts[-3] if len(model_path.parts) >= 3 else model_path.name
        stubs.append(StubProcess(pid, int(fields[19]), model, ppid, int(parent_fields[19])))
    return stubs


def running(pid: int, start_time: int) -> bool:
    """Whether the process `pid` that started at `start_time` still runs (not a zombie, not a new
    process under a reused pid)."""
    fields = _stat_fields(pid)
    return fields is not None and len(fields) >= 20 and fields[0] != "Z" and int(fields[19]) == start_time
