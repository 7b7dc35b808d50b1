"""The supervisor's watch over its tritonserver's python-backend stubs (`runtime.stub_health`): which stubs a
session runs, and the first that dies. Real processes stand in for stubs: Python run under the stub's
executable name with a model's `model.py` as its script, as Triton starts a stub
(`triton_python_backend_stub <repository>/<model>/1/model.py ...`), under a "tritonserver" that leads a
session of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from trtllm_truss.runtime.process_tree import STUB_EXECUTABLE, python_stubs, running
from trtllm_truss.runtime.stub_health import StubSet, watch_stubs


# The "tritonserver": leads its session, starts the stub under the stub's name and prints its pid.
SERVER = """
import subprocess, sys, threading
stub = subprocess.Popen([sys.argv[1], sys.argv[2], "shm-region", "1048576"], executable=sys.executable,
                        stdout=subprocess.PIPE, text=True)
assert stub.stdout.readline().strip() == "up"
print(stub.pid, flush=True)
threading.Event().wait()
"""


@dataclass
class Session:
    server: subprocess.Popen
    stub: int


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    model = tmp_path / "model_repository" / "tensorrt_llm" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text("import threading\nprint('up', flush=True)\nthreading.Event().wait()\n")
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path / STUB_EXECUTABLE), str(model)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    stub = int(server.stdout.readline())
    yield Session(server, stub)
    for pid in (stub, server.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.wait()


def _poll(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)  # the polling period


def test_a_sessions_stubs_are_found_with_their_model_and_a_dead_one_is_seen(session: Session):
    (found,) = python_stubs(session.server.pid)
    assert (found.pid, found.model, found.parent) == (session.stub, "tensorrt_llm", session.server.pid)
    assert python_stubs(os.getsid(0)) == []  # another session's processes are not its stubs
    assert running(found.pid, found.start_time) and not running(found.pid, found.start_time + 1)  # a reused pid
    stubs = StubSet(session.server.pid)
    assert len(stubs) == 1 and stubs.dead() == []
    os.kill(session.stub, signal.SIGKILL)
    _poll(stubs.dead)  # a zombie its server has not reaped counts as dead
    assert stubs.dead() == [f"tensorrt_llm (pid {session.stub})"]


def test_a_stub_that_went_with_its_server_is_not_a_stub_death(session: Session):
    """A killed tritonserver (or MPI rank) takes its stubs with it: that death is the server's to report."""
    stubs = StubSet(session.server.pid)
    session.server.kill()
    session.server.wait()
    os.kill(session.stub, signal.SIGKILL)
    _poll(lambda: not running(*next((s.pid, s.start_time) for s in stubs._stubs)))
    assert stubs.dead() == []


def test_the_watch_records_once_ready_and_reports_the_first_death(session: Session):
    ready, exited = threading.Event(), threading.Event()
    recorded: list[StubSet] = []
    deaths: list[list[str]] = []
    turns: list[int] = []  # the watch asks over() once per turn

    def over() -> bool:
        turns.append(1)
        return False

    watch = threading.Thread(target=watch_stubs, args=(session.server.pid, ready, exited, over, recorded.append, deaths.append),
                             kwargs={"poll_s": 0.02})
    watch.start()
    _poll(lambda: len(turns) >= 3)
    assert recorded == []  # three turns before ready: nothing recorded
    ready.set()
    _poll(lambda: recorded)
    assert len(recorded[0]) == 1 and deaths == []
    os.kill(session.stub, signal.SIGKILL)
    watch.join(10)
    assert not watch.is_alive() and deaths == [[f"tensorrt_llm (pid {session.stub})"]]


def test_the_watch_reports_nothing_once_the_server_is_over(session: Session):
    """A stub that ends with its server (tritonserver died first, or the supervisor stops it) is not a
    stub death: the server's own exit is the monitor's to report."""
    ready, exited = threading.Event(), threading.Event()
    over = threading.Event()
    deaths: list[list[str]] = []
    ready.set()
    watch = threading.Thread(target=watch_stubs, args=(session.server.pid, ready, exited, over.is_set, lambda _: None,
                                                       deaths.append), kwargs={"poll_s": 0.05})
    watch.start()
    over.set()
    os.kill(session.stub, signal.SIGKILL)
    watch.join(10)
    assert not watch.is_alive() and deaths == []
    exited.set()
