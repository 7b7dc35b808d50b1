"""What the direct front's processes share: one small file mapped into each of them.

Layout (little-endian 8-byte values): a header (`stack_ready`, `stack_failed`, `max_in_flight`,
`frontends`, and when a frontend last refused a request for an unavailable engine and last served one:
`SharedAvailability`), one admission count, one pid and one open-connection count per frontend, then each
frontend's serving-metrics array (`serving.metrics.STATE_SIZE` float64s). The launcher creates the file,
writes the header and clears the slot of a frontend that died; frontend `i` writes only its own count,
pid, connections and metrics array, and reads everyone's.

Admission is one bound for the whole replica: a frontend takes a slot by checking the sum of all
counts and adding to its own under `flock` on the file (two system calls per request, not per token;
the kernel drops a dead holder's lock). A frontend that is restarted zeroes its own count: the
requests it held died with it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from pathlib import Path

import numpy as np

from trtllm_truss.serving import availability
from trtllm_truss.serving.metrics import STATE_SIZE

_HEADER = 6
_READY, _FAILED, _MAX_IN_FLIGHT, _FRONTENDS, _REFUSED_NS, _SERVED_NS = range(_HEADER)
_PER_FRONTEND = 3  # admission count, pid, open connections


def _size(frontends: int) -> int:
    return 8 * (_HEADER + _PER_FRONTEND * frontends + frontends * STATE_SIZE)


class ReplicaState:
    """A view of the shared file (`create` in the launcher, `open` in each frontend)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd
        header = np.frombuffer(os.pread(fd, 8 * _HEADER, 0), dtype=np.int64)
        self.frontends = int(header[_FRONTENDS])
        self._map = mmap.mmap(fd, _size(self.frontends))
        n = self.frontends
        self._ints = np.frombuffer(self._map, dtype=np.int64, count=_HEADER + _PER_FRONTEND * n)
        self._counts = self._ints[_HEADER:_HEADER + n]
        self._pids = self._ints[_HEADER + n:_HEADER + 2 * n]
        self._connections = self._ints[_HEADER + 2 * n:]
        offset = 8 * (_HEADER + _PER_FRONTEND * n)
        self._metrics = np.frombuffer(self._map, dtype=np.float64, offset=offset).reshape(self.frontends, STATE_SIZE)

    @classmethod
    def create(cls, path: Path, *, frontends: int, max_in_flight: int) -> ReplicaState:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, _size(frontends))
        os.pwrite(fd, np.array([0, 0, max_in_flight, frontends, 0, 0], dtype=np.int64).tobytes(), 0)
        return cls(path, fd)

    @classmethod
    def open(cls, path: Path) -> ReplicaState:
        return cls(path, os.open(path, os.O_RDWR))

    # --- the stack (launcher writes, frontends read) ----------------------------------------------

    @property
    def stack_ready(self) -> bool:
        return bool(self._ints[_READY])

    @stack_ready.setter
    def stack_ready(self, ready: bool) -> None:
        self._ints[_READY] = int(ready)

    @property
    def stack_failed(self) -> bool:
        """tritonserver died and could not be restarted: liveness fails, the container is replaced."""
        return bool(self._ints[_FAILED])

    @stack_failed.setter
    def stack_failed(self, failed: bool) -> None:
        self._ints[_FAILED] = int(failed)

    @property
    def max_in_flight(self) -> int:
        return int(self._ints[_MAX_IN_FLIGHT])

    def availability(self) -> SharedAvailability:
        return SharedAvailability(self)

    # --- frontends ----------------------------------------------------------------------------------

    def metrics_array(self, index: int) -> np.ndarray:
        return self._metrics[index]

    def all_metrics_arrays(self) -> list[np.ndarray]:
        return list(self._metrics)

    def frontend_started(self, index: int, pid: int) -> None:
        """Frontend `index` (re)starts: its predecessor's admitted requests are gone."""
        with self._locked():
            self._counts[index] = 0
        self._connections[index] = 0
        self._pids[index] = pid

    def frontend_exited(self, index: int) -> None:
        """The launcher found frontend `index` dead: its connections and admitted requests died with it
        (their slots free at once, not when its successor starts), and until it is up again the others
        must not leave new connections to it (`fronts.accept`)."""
        with self._locked():
            self._counts[index] = 0
        self._pids[index] = 0
        self._connections[index] = 0

    def frontend_pid(self, index: int) -> int:
        return int(self._pids[index])

    def frontend_pids(self) -> list[int]:
        """Every frontend's pid, 0 for one not up."""
        return [int(pid) for pid in self._pids]

    def set_connections(self, index: int, open_connections: int) -> None:
        self._connections[index] = open_connections

    def connections(self) -> list[int]:
        """Every frontend's open connections (0 for one not up)."""
        return [int(n) for n in self._connections]

    def admitted(self) -> int:
        return int(self._counts.sum())

    def admission(self, index: int) -> SharedAdmission:
        return SharedAdmission(self, index)

    def _locked(self) -> _FileLock:
        return _FileLock(self._fd)

    def close(self) -> None:
        self._ints = self._counts = self._pids = self._connections = self._metrics = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:  # a metrics view still held (the process is ending anyway)
            pass
        os.close(self._fd)


class SharedAdmission:
    """`streaming.pool.Admission` over the replica's counts: one bound across every frontend."""

    def __init__(self, state: ReplicaState, index: int) -> None:
        self._state = state
        self._index = index
        self._limit = state.max_in_flight

    def take(self) -> bool:
        state = self._state
        with state._locked():
            if int(state._counts.sum()) >= self._limit:
                return False
            state._counts[self._index] += 1
        return True

    def give_back(self) -> None:
        state = self._state
        with state._locked():
            state._counts[self._index] -= 1


class SharedAvailability:
    """`serving.availability.Availability` over the replica's header: a refusal in any frontend makes
    every frontend's readiness 503 at once, a request served by any clears it (single 8-byte stores)."""

    def __init__(self, state: ReplicaState) -> None:
        self._ints = state._ints

    def refused(self, sent_ns: int) -> None:
        if sent_ns >= self._ints[_SERVED_NS]:
            self._ints[_REFUSED_NS] = time.monotonic_ns()

    def served(self) -> None:
        self._ints[_SERVED_NS] = time.monotonic_ns()

    def refusing(self) -> bool:
        return availability.refusing(int(self._ints[_REFUSED_NS]), int(self._ints[_SERVED_NS]), time.monotonic_ns())


class _FileLock:
    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
