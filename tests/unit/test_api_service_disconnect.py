"""A client that leaves before any StreamingResponse watches it still cancels the work (-> 499)."""

from __future__ import annotations

import asyncio
import time

import pytest
from starlette.requests import Request

from trtllm_truss.service import _Refused, _unless_disconnected

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
