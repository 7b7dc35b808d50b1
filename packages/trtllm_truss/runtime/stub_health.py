"""The supervisor's watch over the python-backend stubs of its tritonserver: a stub that dies ends the server.

Triton's python backend restarts no stub: a decoupled model's never ("TODO: Implement restart on decoupled",
python_backend `TRITONBACKEND_ModelInstanceExecute`), and the python_backend nvidia-pytriton 0.7.0 ships
(r24.10) not even a non-decoupled one (measured: after SIGKILL of a `postprocessing` stub every request of
that instance answered "Stub process 'postprocessing_0_1' is not healthy." until tritonserver stopped). A
dead stub of the engine model also leaves the requests it held open for ever: Triton sends them nothing more
and ends nothing (measured with the stand-in: 64 open streams waited out their clients' 60 s timeout), and
tritonserver's stop then waits out its exit timeout for them.

So once tritonserver is ready, `watch_stubs` records the stubs of its session (rank 0's and any other local
rank's) and checks every `POLL_S` that each still runs; the first one gone (killed, crashed, or ended by its
own hang watchdog: `runtime.stub_watch`) is reported to `on_death`, which ends the server: the supervisor
restarts it as after any other death, and the gRPC streams the dead server held end with UNAVAILABLE, which
every client sees as an error. `StubSet.dead()` is cheap (one /proc read per stub), so readiness reads it too.
Stubs on other nodes of a multi-node world are not seen here (their rank's death ends the MPI world).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from trtllm_truss.runtime.process_tree import python_stubs, running

POLL_S = 0.5


class StubSet:
    """The stubs a ready tritonserver session runs, as recorded then."""

    def __init__(self, session_id: int) -> None:
        self._stubs = python_stubs(session_id)

    def __len__(self) -> int:
        return len(self._stubs)

    def dead(self) -> list[str]:
        """The recorded stubs that no longer run while the tritonserver (rank) that started them still does,
        as `model (pid N)`. A stub whose own server is gone went with it: that death is the server's (or in a
        multi-rank world, the rank's, which ends the MPI world), not a stub's."""
        return [f"{stub.model} (pid {stub.pid})" for stub in self._stubs
                if not running(stub.pid, stub.start_time) and running(stub.parent, stub.parent_start_time)]


def watch_stubs(
    session_id: int,
    ready: threading.Event,
    exited: threading.Event,
    over: Callable[[], bool],
    on_record: Callable[[StubSet], None],
    on_death: Callable[[list[str]], None],
    poll_s: float = POLL_S,
) -> None:
    """Run on a thread per tritonserver launch: once `ready` is set, record its stubs (`on_record`), then call
    `on_death(dead)` at the first that died and return. Returns without a call once `exited` is set or
    `over()` (the server exited, or is being stopped)."""
    while not ready.wait(poll_s):
        if exited.is_set() or over():
            return
    stubs = StubSet(session_id)
    on_record(stubs)
    while not exited.wait(poll_s):
        if over():
            return
        dead = stubs.dead()
        if dead:
            on_death(dead)
            return
