"""Readiness follows the front's refusals (serving.availability): a request refused for an unavailable
engine makes readiness 503 at once, in every process of the direct front, until a request is served or
`HOLD_S` passes without another refusal; a stale refusal (a request sent before the last one served)
counts for nothing."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from trtllm_truss.engine.client import GenerationParams
from trtllm_truss.fronts.replica_state import ReplicaState
from trtllm_truss.fronts.service import LLMService
from trtllm_truss.serving import availability
from trtllm_truss.serving.availability import HOLD_S, Availability
from trtllm_truss.serving.core import Refused, RequestCore
from trtllm_truss.streaming.pool import BoundedPool, ResponseStream
from trtllm_truss.streaming.protocol import GenerationSpec, StreamEnd


def test_a_refusal_counts_until_a_request_is_served_or_the_hold_passes():
    second = 10**9
    assert not availability.refusing(0, 0, 100 * second)  # nothing refused yet
    assert availability.refusing(100 * second, 50 * second, 100 * second)
    assert availability.refusing(100 * second, 50 * second, 100 * second + int(HOLD_S * second) - 1)
    assert not availability.refusing(100 * second, 50 * second, 100 * second + int(HOLD_S * second))
    assert not availability.refusing(100 * second, 101 * second, 101 * second)  # served since


@pytest.fixture(params=["in_process", "shared"])
def pair(request, tmp_path):
    """Two views of one availability: one process's twice, or two frontends' of the replica's file."""
    if request.param == "in_process":
        one = Availability()
        yield one, one
        return
    state = ReplicaState.create(tmp_path / "replica", frontends=2, max_in_flight=8)
    other = ReplicaState.open(tmp_path / "replica")
    yield state.availability(), other.availability()
    other.close()
    state.close()


def test_a_refusal_anywhere_is_read_everywhere_and_a_request_served_clears_it(pair):
    first, second = pair
    assert not first.refusing() and not second.refusing()
    sent = time.monotonic_ns()
    first.refused(sent)
    assert first.refusing() and second.refusing()
    second.served()
    assert not first.refusing() and not second.refusing()
    first.refused(sent)  # sent before the request served since: stale
    assert not second.refusing()
    first.refused(time.monotonic_ns())
    assert second.refusing()


def test_the_replica_header_keeps_its_other_fields(tmp_path):
    state = ReplicaState.create(tmp_path / "replica", frontends=3, max_in_flight=7)
    state.availability().refused(time.monotonic_ns())
    other = ReplicaState.open(tmp_path / "replica")
    assert (other.frontends, other.max_in_flight, other.stack_ready, other.stack_failed) == (3, 7, False, False)
    other.close()
    state.close()


# ------------------------------------------------------------------- the request core and truss's readiness


class _Pool(BoundedPool):
    """The stream pool's front side with no worker: each stream ends as `ends` says, in order."""

    def __init__(self, ends: list) -> None:
        super().__init__(max_in_flight=8, chunk_rate=float("inf"), admission=None)
        self.pool = self  # ResponseStream reads worker.pool
        self._ends = ends

    def forget(self, stream: ResponseStream) -> None:
        pass

    async def submit(self, spec: GenerationSpec) -> ResponseStream:
        self.claim()
        stream = ResponseStream(1, self)
        end = self._ends.pop(0)
        asyncio.get_running_loop().call_soon(stream._deliver, "" if end else "Hi", None, end)
        return stream


@pytest.fixture(autouse=True)
def _private_metrics(monkeypatch):
    from prometheus_client import CollectorRegistry

    from trtllm_truss.serving import core
    from trtllm_truss.serving.metrics import ServingMetrics

    monkeypatch.setattr(core, "_METRICS", ServingMetrics(CollectorRegistry()))


async def _open(core: RequestCore) -> int:
    try:
        generation = await core.open(GenerationSpec(GenerationParams("", 1)), None)
    except Refused as exc:
        return exc.status
    generation.close()
    return 200


async def test_the_core_records_refusals_for_an_unreachable_engine_and_requests_served():
    down = StreamEnd(error="the engine is unavailable (UNAVAILABLE)", status=503, engine_down=True)
    worker_gone = StreamEnd(error="the stream worker serving this request stopped", status=503)
    refused = StreamEnd(error="the engine refused the request: bad", status=400)
    core = RequestCore()
    core._pool = _Pool([worker_gone, refused, down, None])  # type: ignore[assignment]
    assert [await _open(core)] == [503] and not core.availability.refusing()  # a worker, not the engine
    assert [await _open(core)] == [400] and not core.availability.refusing()  # the request's fault
    assert [await _open(core)] == [503] and core.availability.refusing()
    assert [await _open(core)] == [200] and not core.availability.refusing()


async def test_trusss_readiness_reads_503_on_a_refusal_while_the_stack_checks_still_pass():
    """The stack's checks all pass (tritonserver alive and ready, a worker running, no probe): only the
    refusal says otherwise, and readiness follows it."""
    service = LLMService("/nonexistent")
    service._stop_signals_chained = True
    service._stack = SimpleNamespace(is_worker_node=False, server=SimpleNamespace(alive=True, ready=lambda: True))
    service._pool = SimpleNamespace(alive=lambda: True)
    assert await service.is_healthy()
    service.core.availability.refused(time.monotonic_ns())
    assert not await service.is_healthy()
    service.core.availability.served()
    assert await service.is_healthy()
