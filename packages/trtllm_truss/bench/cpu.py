"""CPU time of the measured servers' processes, read from /proc (psutil) around each measured round.

The processes are grouped by what they are:
- `serving_path`: ours, truss's server process and everything under it that is not Triton's
  (the stream workers);
- `tritonserver`: the tritonserver process itself (its gRPC side, the ensemble scheduler, the
  python backend's IPC; NVIDIA's C++ engine would run here too);
- `python_stubs`: Triton's python-backend stub processes (the engine stand-in, pre/postprocessing) and
  the processes they start (the llmapi model's LLM host and its executor's worker: the engine's side);
- `truss_process`: truss's server process alone (also counted in `serving_path`): its one event-loop
  thread handles every HTTP request and chunk, so its cores near 1 mean that thread is the limit.

A probe is given the root processes of what is measured (truss's server, or tritonserver when the
gRPC targets run without truss); every process of their trees is read. A process started during a
round (a restarted worker) counts all its CPU; one that ended during it loses the CPU it used in
the round (its times can no longer be read). A root found by the port it listens on is the process
listening there when the run starts; a tritonserver this command started is read through its
supervisor (`current_roots`), so a restarted one is followed. A root that ended during a round (a
restart, a crash) takes its CPU of the round with it: the session warns that the round's CPU misses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

GROUPS = ("serving_path", "tritonserver", "python_stubs", "truss_process")
TRUSS_PROCESS = "truss_process"  # a part of serving_path, reported on its own

# pid -> (group, create time, user + system CPU seconds)
Snapshot = dict[int, tuple[str, float, float]]


def classify(name: str, exe_name: str) -> str:
    """The group of a process from its name (or its executable's, for a renamed one)."""
    names = (name, exe_name)
    if any(n.startswith("tritonserver") for n in names):
        return "tritonserver"
    if any("triton_python_backend_stub" in n for n in names):
        return "python_stubs"
    return "serving_path"


@dataclass(frozen=True)
class CpuProbe:
    """Reads the CPU seconds of every process in the trees under `roots` (or, where given, under the pids
    `current_roots()` returns at each snapshot: a supervised process that may be replaced)."""

    roots: tuple[int, ...]
    current_roots: Callable[[], Iterable[int | None]] | None = None

    def root_pids(self) -> tuple[int, ...]:
        if self.current_roots is None:
            return self.roots
        return tuple(pid for pid in self.current_roots() if pid is not None)

    def snapshot(self) -> Snapshot:
        seen: Snapshot = {}
        parents: dict[int, int] = {}
        for root in self.root_pids():
            try:
                top = psutil.Process(root)
                processes = [top, *top.children(recursive=True)]
            except psutil.Error:
                continue
            for process in processes:
                if process.pid in seen:
                    continue
                try:
                    with process.oneshot():
                        times = process.cpu_times()
                        exe = (process.cmdline() or [""])[0].rsplit("/", 1)[-1]
                        group = classify(process.name(), exe)
                        if process is top and group == "serving_path":
                            group = TRUSS_PROCESS  # a root that is not Triton's: truss's server
                        seen[process.pid] = (group, process.create_time(), times.user + times.system)
                        parents[process.pid] = process.ppid()
                except psutil.Error:
                    continue
        for pid, (group, created, cpu) in list(seen.items()):
            if group == "serving_path" and _under_a_stub(pid, seen, parents):
                seen[pid] = ("python_stubs", created, cpu)
        return seen


def _under_a_stub(pid: int, seen: Snapshot, parents: dict[int, int]) -> bool:
    while (pid := parents.get(pid, 0)) in seen:
        if seen[pid][0] == "python_stubs":
            return True
    return False


def cpu_between(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds each group used between two snapshots (a pid reused by a new process counts from 0)."""
    used = {group: 0.0 for group in GROUPS}
    for pid, (group, created, cpu) in after.items():
        earlier = before.get(pid)
        start = earlier[2] if earlier is not None and earlier[1] == created else 0.0
        spent = max(cpu - start, 0.0)
        used[group] += spent
        if group == TRUSS_PROCESS:
            used["serving_path"] += spent
    return used


def listening_pid(url: str) -> int | None:
    """The pid of the local process listening on `url`'s port (host:port or http://host:port), if
    one of this user's processes does (psutil reads /proc/net and the processes' sockets)."""
    parsed = urlsplit(url if "://" in url else f"tcp://{url}")
    if parsed.port is None or parsed.hostname not in ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]"):
        return None
    try:
        connections = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return None
    for connection in connections:
        listening = connection.status == psutil.CONN_LISTEN and connection.laddr
        if listening and connection.laddr.port == parsed.port and connection.pid is not None:
            return connection.pid
    return None


def probe_for(pids: Iterable[int | None]) -> CpuProbe | None:
    roots = tuple(dict.fromkeys(pid for pid in pids if pid is not None))
    return CpuProbe(roots) if roots else None
