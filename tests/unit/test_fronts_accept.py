"""Which direct-front process takes a new connection (`fronts.accept`): the lowest with room first.

The rule is a pure function of the shared counts; the filler runs for real here: two processes, each a
real uvicorn server with its `ConnectionFiller` on one shared listening socket and one replica file, and
real clients whose connections stay open (keep-alive), counted per process by the kernel (psutil)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import psutil
import pytest

from trtllm_truss.fronts.accept import accepts_connections
from trtllm_truss.fronts.replica_state import ReplicaState

UP = [101, 102, 103]


@pytest.mark.parametrize(
    "connections, pids, fill, takers",
    [
        ([0, 0, 0], UP, 2, [0]),  # the lowest first
        ([2, 0, 0], UP, 2, [1]),  # full: the next one
        ([2, 1, 0], UP, 2, [1]),
        ([2, 2, 2], UP, 2, [0, 1, 2]),  # every one full: those with the fewest (all here; the kernel picks)
        ([3, 2, 5], UP, 2, [1]),
        ([3, 3, 2], UP, 2, [2]),
        ([1, 2, 0], UP, 2, [0]),  # a connection closed below: back to the lowest
        # Frontend 0 not up (dead, or starting): the others do not wait for it; in its own view it counts.
        ([0, 0, 0], [0, 102, 103], 2, [0, 1]),
        ([0, 0, 0], [101, 0, 103], 2, [0]),
        ([5, 1, 3], UP, 0, [1]),  # no filling: the fewest connections
    ],
)
def test_the_lowest_frontend_with_room_takes_new_connections(connections, pids, fill, takers):
    assert [i for i in range(3) if accepts_connections(i, connections, pids, fill)] == takers


@pytest.mark.parametrize(
    "connections, waiting, takers",
    [
        ([0, 0, 0, 0], 10, [0]),  # the first has room for what waits
        ([0, 0, 0, 0], 40, [0, 1]),  # more than it has room for: the next one helps
        ([0, 0, 0, 0], 70, [0, 1, 2]),
        ([31, 0, 0, 0], 5, [0, 1]),
        ([32, 5, 0, 0], 30, [1, 2]),
        ([32, 32, 32, 32], 50, [0, 1, 2, 3]),  # every one full: the fewest (all), waiting or not
    ],
)
def test_a_burst_is_taken_by_as_many_as_have_room_for_it(connections, waiting, takers):
    pids = [101, 102, 103, 104]
    assert [i for i in range(4) if accepts_connections(i, connections, pids, 32, waiting)] == takers


def _frontend(index: int, fd: int, state_path: str, fill: int, ready) -> None:
    import uvicorn

    from trtllm_truss.fronts.accept import RECHECK_SIGNAL, ConnectionFiller
    from trtllm_truss.fronts.direct_app import _Server

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": str(os.getpid()).encode()})

    state = ReplicaState.open(Path(state_path))
    listener = socket.socket(fileno=fd)
    filler = ConnectionFiller(listener, state, index, fill)
    signal.signal(RECHECK_SIGNAL, signal.SIG_IGN)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = _Server(config, on_exit=lambda: None, filler=filler)
    state.frontend_started(index, os.getpid())
    ready.set()
    server.run(sockets=[])


def poll(condition, timeout_s: float, interval_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s} s")
        time.sleep(interval_s)  # polling state other processes write


def _established(pid: int, port: int) -> int:
    return sum(1 for c in psutil.Process(pid).net_connections("tcp") if c.status == "ESTABLISHED" and c.laddr.port == port)


@pytest.mark.timeout(120)
def test_connections_fill_the_first_process_then_the_next_and_return_when_it_has_room(tmp_path: Path):
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    port = listener.getsockname()[1]
    state = ReplicaState.create(tmp_path / "replica", frontends=2, max_in_flight=8)
    context = multiprocessing.get_context("fork")
    processes = []
    try:
        for index in range(2):
            ready = context.Event()
            process = context.Process(target=_frontend, args=(index, listener.fileno(), str(state.path), 2, ready))
            process.start()
            assert ready.wait(30)
            processes.append(process)
        pids = [p.pid for p in processes]
        base = f"http://127.0.0.1:{port}"

        def counts() -> list[int]:
            return [_established(pid, port) for pid in pids]

        clients = [httpx.Client(base_url=base, timeout=10) for _ in range(5)]
        served = [int(c.get("/").text) for c in clients[:2]]  # each keeps its connection open
        assert served == [pids[0], pids[0]]
        assert int(clients[2].get("/").text) == pids[1]  # the first holds 2: the next takes it
        assert int(clients[3].get("/").text) == pids[1]
        assert int(clients[4].get("/").text) in pids  # both hold 2: either
        poll(lambda: counts() in ([3, 2], [2, 3]), 10, 0.05, "five connections established, 3 and 2")
        assert state.connections() == counts()
        fewer = counts().index(2)
        clients.append(httpx.Client(base_url=base, timeout=10))
        assert int(clients[-1].get("/").text) == pids[fewer]  # past fill: the one with the fewest
        poll(lambda: counts() == [3, 3] == state.connections(), 10, 0.02, "3 connections each")

        clients.pop(0).close()  # room in the first again (1 of 2): it takes the next one
        clients.pop(0).close()
        poll(lambda: state.connections() == [1, 3], 10, 0.02, "the closes counted")
        late = httpx.Client(base_url=base, timeout=10)
        assert int(late.get("/").text) == pids[0]
        clients.append(late)
        for client in clients:
            client.close()
        poll(lambda: state.connections() == [0, 0], 10, 0.02, "every close counted")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(15)
            if process.is_alive():
                process.kill()
        listener.close()
        state.close()


def test_the_connections_waiting_are_read_from_the_kernel():
    from trtllm_truss.fronts.accept import ConnectionFiller

    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
    try:
        filler = ConnectionFiller(listener, state=None, index=0, fill=1)
        poll(lambda: filler._waiting() == 3, 5, 0.01, "three connections waiting")
        listener.accept()[0].close()
        assert filler._waiting() == 2
    finally:
        for client in clients:
            client.close()
        listener.close()
