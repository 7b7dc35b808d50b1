"""A client that leaves before any StreamingResponse watches it still cancels the work (-> 499);
the first token wakes the request straight from the worker socket's callback."""

from __future__ import annotations

import asyncio
import time

import pytest
from starlette.requests import Request

from trtllm_truss.engine.client import GenerationParams
from trtllm_truss.serving.core import Refused as _Refused
from trtllm_truss.serving.core import RequestCore
from trtllm_truss.serving.core import unless_disconnected as _unless_disconnected
from trtllm_truss.streaming.pool import BoundedPool, ResponseStream
from trtllm_truss.streaming.protocol import GenerationSpec, StreamEnd

SCOPE = {"type": "http", "method": "POST", "path": "/", "headers": []}


def _request(disconnect_after_s: float) -> Request:
    """A real Starlette request whose ASGI channel reports the client gone after a delay."""

    gone_at = time.monotonic() + disconnect_after_s

    async def receive() -> dict:
        # Like uvicorn: a pending disconnect is returned without waiting, otherwise receive() waits.
        if time.monotonic() >= gone_at:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    return Request(SCOPE, receive)


async def test_work_is_cancelled_when_the_client_leaves():
    cancelled = asyncio.Event()

    async def long_generation() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    with pytest.raises(_Refused) as caught:
        await asyncio.wait_for(_unless_disconnected(long_generation(), _request(0.3), "the answer"), timeout=5)
    assert caught.value.status == 499 and "the answer" in caught.value.message
    assert cancelled.is_set()


async def test_result_is_returned_when_the_client_stays():
    async def quick() -> str:
        await asyncio.sleep(0.01)
        return "done"

    assert await _unless_disconnected(quick(), _request(60.0), "x") == "done"
    assert await _unless_disconnected(quick(), None, "x") == "done"


class _Pool(BoundedPool):
    """The stream pool's truss side, no worker behind it: `submit` hands back one stream and records the
    cancellation (the real pool sends `cancel` to the worker when the stream closes)."""

    def __init__(self) -> None:
        super().__init__(max_in_flight=8, chunk_rate=float("inf"), admission=None)  # its own bound, no pacing
        self.forgotten: list[ResponseStream] = []
        self.pool = self  # ResponseStream reads worker.pool
        self.stream: ResponseStream | None = None

    def forget(self, stream: ResponseStream) -> None:
        self.forgotten.append(stream)

    async def submit(self, spec: GenerationSpec) -> ResponseStream:
        self.claim()
        self.stream = ResponseStream(1, self)
        return self.stream


@pytest.fixture(autouse=True)
def _private_metrics(monkeypatch):
    """The service's metrics on a registry of this test's own, not the process's default one."""
    from prometheus_client import CollectorRegistry

    from trtllm_truss.serving.metrics import ServingMetrics
    from trtllm_truss.serving import core

    monkeypatch.setattr(core, "_METRICS", ServingMetrics(CollectorRegistry()))


class _Core(RequestCore):
    def __init__(self, pool: _Pool) -> None:
        super().__init__()
        self._pool = pool  # type: ignore[assignment]


def _service(pool: _Pool) -> _Core:
    return _Core(pool)


async def test_a_client_gone_before_the_first_token_cancels_the_request():
    pool = _Pool()
    with pytest.raises(_Refused) as caught:
        await asyncio.wait_for(_service(pool).open(GenerationSpec(None), _request(0.3)), timeout=5)
    assert caught.value.status == 499 and "first token" in caught.value.message
    assert pool.forgotten == [pool.stream] and pool.open_streams == 0


async def test_the_first_token_is_returned_as_it_arrives():
    pool = _Pool()
    service = _service(pool)
    opening = asyncio.ensure_future(service.open(GenerationSpec(GenerationParams("", 1)), _request(60.0)))
    while pool.stream is None:
        await asyncio.sleep(0)
    pool.stream._deliver("Hello", None, None)
    generation = await asyncio.wait_for(opening, timeout=5)
    assert generation._first == ["Hello"] and generation.stream is pool.stream and not pool.forgotten


async def test_wait_for_text_times_out_then_wakes_on_delivery_or_end():
    stream = ResponseStream(1, _Pool())
    assert await stream.wait_for_text(0.01) is False
    asyncio.get_running_loop().call_soon(stream._deliver, "", None, StreamEnd(error="gone", status=503))
    assert await asyncio.wait_for(stream.wait_for_text(60.0), timeout=5) is True
    assert await stream.next_text() is None and stream.end.status == 503
