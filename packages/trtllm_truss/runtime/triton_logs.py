"""Triton's log lines: severity classification, error extraction, and the thread forwarding a child's output.

Kept apart from the supervisor because startup errors and tests classify logs without running a server.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

triton_log = logging.getLogger("trtllm_truss.tritonserver")

__all__ = ["LogForwarder"]


# --------------------------------------------------------------------------------------------- logs

# Triton logs in glog format: `E1122 01:51:11.479672 12841 server.cc:241] "message"`.
_GLOG_LINE = re.compile(r"^(?P<severity>[IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+ +\d+ ")
_SEVERITY_LEVEL = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
# What every Triton prints on a machine without a GPU; there it is not worth a warning and never the cause
# of a failure. On a GPU host the same lines mean a real driver problem, so they keep their level there.
_HARMLESS_WITHOUT_GPU = (
    "CudaDriverHelper has not been initialized",
    "CUDA driver version is insufficient",
    "Unable to allocate pinned system memory",
    "Failed to initialize NVML",
    "DCGM unable to start",
    "Unable to get number of GPUs",
    "CUDA memory pool disabled",
    "Collecting metrics for GPU",
)


HOST_HAS_GPU = any(Path("/dev").glob("nvidia[0-9]*"))

# Python's faulthandler in a stub (runtime/stub_watch.py): a fatal signal or the hang watchdog writes a
# header, then every thread's stack. The whole dump is an error: it says why a stub died.
_FAULT_DUMP_HEADER = re.compile(r"^(Fatal Python error: |Timeout \(\d+:\d{2}:\d{2}(\.\d+)?\)!)")
_FAULT_DUMP_BODY = re.compile(r'^(Thread 0x[0-9a-f]+|Current thread 0x[0-9a-f]+|  File "|  <no Python frame>|Extension modules: |$)')


def log_level_of(line: str, *, gpu_host: bool = HOST_HAS_GPU) -> int:
    """logging level for one Triton log line."""
    if not gpu_host and any(marker in line for marker in _HARMLESS_WITHOUT_GPU):
        return logging.DEBUG
    match = _GLOG_LINE.match(line)
    if match:
        return _SEVERITY_LEVEL[match.group("severity")]
    if line.startswith("error:") or "Traceback (most recent call last)" in line:
        return logging.ERROR
    return logging.INFO


def triton_error_lines(lines: Iterable[str], *, gpu_host: bool = HOST_HAS_GPU) -> list[str]:
    """Triton's own error lines (E/F glog lines, `error: ...` of the launcher), minus GPU-less noise."""
    return [line for line in lines if log_level_of(line, gpu_host=gpu_host) >= logging.ERROR]


def _without_tables(lines: Sequence[str]) -> list[str]:
    """Log lines minus Triton's startup tables (options, backends), keeping rows that report failures."""
    kept = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("+-"):
            continue
        if stripped.startswith("|") and "UNAVAILABLE" not in stripped:
            continue
        kept.append(line)
    return kept


class LogForwarder(threading.Thread):
    """Reads the child's merged stdout/stderr into `logging` with a prefix; keeps a bounded tail."""

    def __init__(self, stream: IO[bytes], prefix: str, *, tail_lines: int = 400, log: logging.Logger = triton_log):
        super().__init__(name=f"{prefix}-log", daemon=True)
        self._stream = stream
        self._prefix = prefix
        self._log = log
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._lock = threading.Lock()

    def run(self) -> None:
        in_fault_dump = False
        try:
            for raw in iter(self._stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with self._lock:
                    self._tail.append(line)
                in_fault_dump = bool(_FAULT_DUMP_HEADER.match(line) or (in_fault_dump and _FAULT_DUMP_BODY.match(line)))
                level = logging.ERROR if in_fault_dump else log_level_of(line)
                self._log.log(level, "[%s] %s", self._prefix, line)
        except (OSError, ValueError):  # pipe closed under us during shutdown
            pass
        finally:
            self._stream.close()

    def tail(self, n: int | None = None) -> list[str]:
        with self._lock:
            lines = list(self._tail)
        return lines if n is None else lines[-n:]
