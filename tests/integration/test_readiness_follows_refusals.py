"""Readiness follows the front's refusals: after SIGKILL of tritonserver under load, readiness
(`/health/ready`, and under truss's server its own readiness route) reads 503 within 0.5 s of the
first 503 the front answers a request with, under both fronts, and stays 503 while requests are
refused as unavailable; then 200 again once a request is served. Readiness was once seen saying 200
for 2-4 s after such a kill while chat requests got 503; readiness now follows the front's refusals
(serving.availability), whatever the stack's own checks say yet. (On the 2-core development machine
the stack's checks alone also read 503 in time here: the unit test of test_availability.py is the one
where they still pass.)

A chat request and a readiness poll go out on new connections every few tens of milliseconds from the
kill until the stack serves again; each is recorded with when it was sent and answered.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from trtllm_truss.fronts.truss_server import READY_PATH, TrussServer
from truss_serving import FRONTS, serve_front

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.slow, pytest.mark.truss_server, pytest.mark.timeout(300),
              pytest.mark.alone]

STEP_MS = 40
ENV = {
    "TRTLLM_RUNTIME__PYTORCH__SYNTHETIC__STEP_TIME_MS": str(STEP_MS),
    "TRTLLM_BUILD__MAX_BATCH_SIZE": "64",
}
LOAD_STREAMS = 16
LOAD_TOKENS = 200  # x 40 ms: open through the kill
GRACE_S = 0.5  # readiness reads 503 within this of the first refusal
POLL_S = 0.03
RECOVERY_S = 120.0
REQUEST_TIMEOUT_S = 15.0
CHAT = {"model": "embedded", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module", params=FRONTS)
def stack(request, tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_front(request.param, tmp_path_factory.mktemp(f"readiness_{request.param}"), ENV)


async def _status(url: str, method: str, path: str, **kwargs) -> int | str:
    """One request on a new connection."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
            return (await http.request(method, path, **kwargs)).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


async def _serving(url: str) -> None:
    deadline = time.monotonic() + RECOVERY_S
    while time.monotonic() < deadline:
        if await _status(url, "GET", READY_PATH) == 200 and await _status(url, "POST", "/v1/chat/completions", json=CHAT) == 200:
            return
        await asyncio.sleep(0.1)  # the polling period
    raise AssertionError(f"not serving within {RECOVERY_S:g} s")


async def _stream(url: str, opened: asyncio.Event) -> None:
    body = {**CHAT, "max_tokens": LOAD_TOKENS, "stream": True, "ignore_eos": True}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60.0) as http, http.stream("POST", "/v1/chat/completions", json=body) as answer:
            async for _ in answer.aiter_lines():
                opened.set()
    except httpx.HTTPError:
        pass
    finally:
        opened.set()


async def _poll(url: str, method: str, path: str, log: list, done: asyncio.Event, **kwargs) -> None:
    """(sent, answered, status) every POLL_S from now until `done`, each on its own connection."""
    pending = set()

    async def one() -> None:
        sent = time.monotonic()
        status = await _status(url, method, path, **kwargs)
        log.append((sent, time.monotonic(), status))

    while not done.is_set():
        pending.add(asyncio.ensure_future(one()))
        await asyncio.sleep(POLL_S)  # the sending period
    await asyncio.gather(*pending)


def _report(killed: float, chats: list, readiness: list) -> str:
    def line(name: str, log: list) -> str:
        changes, last = [], None
        for sent, answered, status in sorted(log):
            if status != last:
                changes.append(f"{sent - killed:.2f}->{answered - killed:.2f}:{status}")
                last = status
        return f"{name}: " + " ".join(changes)

    return "\n".join([line("chat", chats), line("readiness", readiness)])


async def test_readiness_reads_503_within_half_a_second_of_the_first_refusal(stack: TrussServer):
    url = stack.url
    await _serving(url)
    opened = [asyncio.Event() for _ in range(LOAD_STREAMS)]
    load = [asyncio.ensure_future(_stream(url, event)) for event in opened]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), 60.0)
    (triton,) = [p for p in psutil.Process(stack.process.pid).children(recursive=True)
                 if "bin/tritonserver" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE]
    chats: list = []
    readiness: list = []
    done = asyncio.Event()
    killed = time.monotonic()
    triton.send_signal(signal.SIGKILL)
    pollers = [asyncio.ensure_future(_poll(url, "POST", "/v1/chat/completions", chats, done, json=CHAT)),
               asyncio.ensure_future(_poll(url, "GET", READY_PATH, readiness, done))]
    try:
        deadline = time.monotonic() + RECOVERY_S
        # Until the outage is over: a refusal seen, then readiness 200 and a chat served after it.
        while True:
            assert time.monotonic() < deadline, _report(killed, chats, readiness)
            refused = [answered for _, answered, status in chats if status == 503]
            if refused:
                back = [sent for sent, _, status in readiness if status == 200 and sent > min(refused)]
                if back and any(status == 200 and sent > min(back) for sent, _, status in chats):
                    break
            await asyncio.sleep(0.1)  # the polling period
    finally:
        done.set()
        await asyncio.gather(*pollers)
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
    report = _report(killed, chats, readiness)
    print(report)
    assert all(status in (200, 503) for _, _, status in chats + readiness), report
    first_refusal = min(answered for _, answered, status in chats if status == 503)
    last_refusal_sent = max(sent for sent, _, status in chats if status == 503)
    # Every readiness poll sent from GRACE_S after the first refusal until the last refused chat was
    # sent reads 503: readiness never says ready while the front refuses for an unavailable engine.
    during = [(sent - killed, status) for sent, _, status in readiness if first_refusal + GRACE_S <= sent <= last_refusal_sent]
    assert all(status == 503 for _, status in during), report
    # ... and it turned 503 at all within the grace, not only after the outage.
    assert any(status == 503 and sent <= first_refusal + GRACE_S for sent, _, status in readiness), report
