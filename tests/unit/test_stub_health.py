"""The supervisor's watch over its tritonserver's python-backend stubs (`runtime.stub_health`): which stubs a
session runs, and the first that dies. Real processes stand in for stubs: Python run under the stub's
executable name with a model's `model.py` as its script, as Triton starts a stub
(`triton_python_backend_stub <repository>/<model>/1/model.py ...`), each in a session of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trtllm_truss.runtime.process_tree import STUB_EXECUTABLE, python_stubs, running
from trtllm_truss.runtime.stub_health import StubSet, watch_stubs


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[subprocess.Popen]:
    model = tmp_path / "model_repository" / "tensorrt_llm" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text("import sys, threading\nprint('up', flush=True)\nthreading.Event().wait()\n")
    process = subprocess.Popen([str(tmp_path / STUB_EXECUTABLE), str(model), "shm-region", "1048576"],
                               executable=sys.executable, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout.readline().strip() == "up"
    yield process
    process.kill()
    process.wait()


def _poll(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)  # the polling period


def test_a_sessions_stubs_are_found_with_their_model_and_a_dead_one_is_seen(stub: subprocess.Popen):
    found = python_stubs(stub.pid)  # the stub leads its own session here
    assert list(found) == [stub.pid] and found[stub.pid][1] == "tensorrt_llm"
    assert python_stubs(1) == {}  # another session's processes are not its stubs
    started = found[stub.pid][0]
    assert running(stub.pid, started) and not running(stub.pid, started + 1)  # a reused pid is another process
    stubs = StubSet(stub.pid)
    assert len(stubs) == 1 and stubs.dead() == []
    stub.send_signal(signal.SIGKILL)
    _poll(stubs.dead)  # a zombie not yet reaped counts as dead
    assert stubs.dead() == [f"tensorrt_llm (pid {stub.pid})"]


def test_the_watch_records_once_ready_and_reports_the_first_death(stub: subprocess.Popen):
    ready, exited = threading.Event(), threading.Event()
    recorded: list[StubSet] = []
    deaths: list[list[str]] = []
    turns: list[int] = []  # the watch asks over() once per turn

    def over() -> bool:
        turns.append(1)
        return False

    watch = threading.Thread(target=watch_stubs, args=(stub.pid, ready, exited, over, recorded.append, deaths.append),
                             kwargs={"poll_s": 0.02})
    watch.start()
    _poll(lambda: len(turns) >= 3)
    assert recorded == []  # three turns before ready: nothing recorded
    ready.set()
    _poll(lambda: recorded)
    assert len(recorded[0]) == 1 and deaths == []
    stub.send_signal(signal.SIGKILL)
    watch.join(10)
    assert not watch.is_alive() and deaths == [[f"tensorrt_llm (pid {stub.pid})"]]


def test_the_watch_reports_nothing_once_the_server_is_over(stub: subprocess.Popen):
    """A stub that ends with its server (tritonserver died first, or the supervisor stops it) is not a
    stub death: the server's own exit is the monitor's to report."""
    ready, exited = threading.Event(), threading.Event()
    over = threading.Event()
    deaths: list[list[str]] = []
    ready.set()
    watch = threading.Thread(target=watch_stubs, args=(stub.pid, ready, exited, over.is_set, lambda _: None,
                                                       deaths.append), kwargs={"poll_s": 0.05})
    watch.start()
    over.set()
    stub.send_signal(signal.SIGKILL)
    watch.join(10)
    assert not watch.is_alive() and deaths == []
    exited.set()
