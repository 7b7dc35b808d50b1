"""trtllm_truss.engine.stream_end and its users: a Triton stream is ended by Triton after its last response,
never cancelled while that end may still be under way (tritonserver 2.51 then leaks the request and
never unloads the model at shutdown, issue 24)."""

from __future__ import annotations

import asyncio

from trtllm_truss.engine.health import EngineProbe
from trtllm_truss.engine.stream_end import end_call, read_to_end


class FakeCall:
    """A raw ModelStreamInfer call: `code()` resolves once Triton has ended it."""

    def __init__(self, ends: bool) -> None:
        self.events: list[str] = []
        self._ends = ends

    async def done_writing(self) -> None:
        self.events.append("done_writing")

    async def code(self) -> str:
        if not self._ends:
            await asyncio.Event().wait()  # Triton never ends it
        self.events.append("ended")
        return "OK"


def test_end_call_half_closes_and_waits_for_triton_to_end_the_call() -> None:
    call = FakeCall(ends=True)
    assert asyncio.run(end_call(call, timeout_s=5)) is True
    assert call.events == ["done_writing", "ended"]


def test_end_call_gives_up_after_its_timeout() -> None:
    call = FakeCall(ends=False)
    assert asyncio.run(end_call(call, timeout_s=0.05)) is False
    assert call.events == ["done_writing"]


async def _responses(count: int, *, then_hang: bool = False, then_fail: bool = False):
    for index in range(count):
        yield index
    if then_fail:
        raise RuntimeError("the call failed")
    if then_hang:
        await asyncio.Event().wait()


def test_read_to_end_reads_what_is_left_until_the_stream_ends() -> None:
    assert asyncio.run(read_to_end(_responses(3), timeout_s=5)) is True


def test_read_to_end_reports_a_stream_that_does_not_end_or_fails() -> None:
    assert asyncio.run(read_to_end(_responses(1, then_hang=True), timeout_s=0.05)) is False
    assert asyncio.run(read_to_end(_responses(1, then_fail=True), timeout_s=5)) is False


class FakeProbeStream:
    """tritonclient's stream_infer iterator: one answer, then Triton ends the call."""

    def __init__(self, log: list[str]) -> None:
        self._log = log
        self._left = 1

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._left == 0:
            self._log.append("ended by Triton")
            raise StopAsyncIteration
        self._left -= 1
        self._log.append("answer")
        return object(), None

    def cancel(self) -> bool:
        self._log.append("cancel")
        return False


class FakeClient:
    def __init__(self) -> None:
        self.log: list[str] = []

    def stream_infer(self, inputs_iterator):
        return FakeProbeStream(self.log)


def test_engine_probe_lets_triton_end_its_stream_before_any_cancel() -> None:
    probe = EngineProbe("127.0.0.1:1", interval_s=1, timeout_s=5)
    client = FakeClient()
    asyncio.run(probe._probe_once(client))
    assert probe.healthy
    assert client.log == ["answer", "ended by Triton", "cancel"]
