"""The stream-worker pool with real worker processes (no tritonserver: the engine is unreachable,
so every admitted request ends with the engine's 503, which is what these tests read)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from trtllm_truss.engine.client import GenerationParams
from trtllm_truss.streaming.environment import worker_environment
from trtllm_truss.streaming.generation import WorkerSettings
from trtllm_truss.streaming.pool import PoolBusy, StreamPool
from trtllm_truss.streaming.protocol import GenerationSpec

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
UNREACHABLE = "127.0.0.1:9"  # discard port: nothing answers gRPC there


@pytest.fixture
def pool():
    """A pool per test: its sockets belong to the event loop of the first request (one per test here)."""
    settings = WorkerSettings(grpc_url=UNREACHABLE, tokenizer_dir=str(EMBEDDED), max_input_len=64, max_output_len=16)
    pool = StreamPool(settings, workers=2, max_in_flight=4, environment=worker_environment(os.environ))
    pool.start()
    yield pool
    pool.stop()


def _spec(prompt: str) -> GenerationSpec:
    return GenerationSpec(GenerationParams("", max_tokens=4), prompt=prompt)


async def _drain(stream) -> tuple[str, object]:
    parts = []
    while (text := await stream.next_text()) is not None:
        parts.append(text)
    stream.close()
    return "".join(parts), stream.end


def test_concurrent_first_requests_all_reach_a_worker(pool: StreamPool):
    """The first requests race to hand the workers' sockets to the event loop: none may be refused."""

    async def run():
        streams = await asyncio.gather(*(pool.submit(_spec(f"hello {i}")) for i in range(4)))
        return await asyncio.gather(*(_drain(s) for s in streams))

    results = asyncio.run(run())
    assert len(results) == 4
    for text, end in results:
        assert text == "" and end.status == 503 and "unavailable" in end.error, end


def test_requests_beyond_max_in_flight_are_refused_and_a_bad_prompt_is_the_clients_error(pool: StreamPool):
    async def run():
        streams = [await pool.submit(_spec("x" * 10_000)) for _ in range(4)]
        with pytest.raises(PoolBusy):
            await pool.submit(_spec("one too many"))
        ends = [(await _drain(s))[1] for s in streams]
        return ends, pool.in_flight

    ends, in_flight = asyncio.run(run())
    assert all(end.status == 400 and "prompt:" in end.error for end in ends), ends
    assert in_flight == 0 and pool.open_streams == 0


def test_a_request_its_worker_never_answered_moves_to_the_other_worker_when_that_one_dies(pool: StreamPool):
    """The race a killed worker leaves: a request reaches it after the kill, before its socket closes. Here
    the worker is stopped (SIGSTOP) so it never reads the request, then killed: the request is answered by
    the other worker (the engine's 503, this pool has no engine), not failed with the dead worker."""
    first, second = pool.pids

    async def run():
        os.kill(first, signal.SIGSTOP)
        try:
            stream = await pool.submit(_spec("hello"))  # both idle: the first worker takes it
            assert stream._worker.process.pid == first
        finally:
            os.kill(first, signal.SIGKILL)
        text, end = await asyncio.wait_for(_drain(stream), timeout=30)
        return stream._worker.process.pid, text, end

    pid, text, end = asyncio.run(run())
    assert pid == second and text == "", pid
    assert end.status == 503 and "unavailable" in end.error and "stopped" not in end.error, end
    assert pool.in_flight == 0 and pool.open_streams == 0


def test_a_request_moves_once_only():
    """A request that itself killed its worker must not go on to kill every worker: its second worker's
    death fails it (`stopped`), though a third worker runs. Workers 1 and 2 are stopped so neither answers."""
    settings = WorkerSettings(grpc_url=UNREACHABLE, tokenizer_dir=str(EMBEDDED), max_input_len=64, max_output_len=16)
    pool = StreamPool(settings, workers=3, max_in_flight=4, environment=worker_environment(os.environ))
    pool.start()
    first, second, _ = pool.pids

    async def run():
        for pid in (first, second):
            os.kill(pid, signal.SIGSTOP)
        try:
            stream = await pool.submit(_spec("hello"))  # all idle: the first worker takes it
            os.kill(first, signal.SIGKILL)
            deadline = asyncio.get_running_loop().time() + 30
            while stream._worker.process.pid != second:  # moved to the least busy of the other two
                assert asyncio.get_running_loop().time() < deadline, "never moved"
                await asyncio.sleep(0.05)  # polling period
        finally:
            os.kill(second, signal.SIGKILL)
        return await asyncio.wait_for(_drain(stream), timeout=30)

    try:
        text, end = asyncio.run(run())
    finally:
        pool.stop()
    assert text == "" and end.status == 503 and "stopped" in end.error, end


def test_stop_ends_every_worker_process():
    settings = WorkerSettings(grpc_url=UNREACHABLE, tokenizer_dir=str(EMBEDDED), max_input_len=64, max_output_len=16)
    pool = StreamPool(settings, workers=2, max_in_flight=4, environment=worker_environment(os.environ))
    pool.start()
    pids = pool.pids
    assert len(pids) == 2
    pool.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
