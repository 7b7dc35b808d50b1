"""Shutdown of the embedded default: after our stop, tritonserver exits within its exit timeout.

Issue 16 measured `failed to stop server: Internal - Exit timeout expired` on every stop: tritonserver
waits for open client gRPC streams (the stream workers', the health probe's) before it unloads the
ensembles, so with a stream still open it only leaves when --exit-timeout-secs expires. The service
closes its clients first (LLMService.shutdown); this pins that, with a request served before the
stop so the workers' streams have been used. Issue 24 found the other cause of that wait: a stream
cancelled right after its final response leaks its request in Triton's gRPC frontend, which then never
unloads the engine model (trtllm_truss.engine.stream_end); the engine probe of this service did that.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_supervisor_serve import _truss_with

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.timeout(300)]

EXIT_TIMEOUT_MESSAGE = "Exit timeout expired"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][:1] != "Z"


@pytest.fixture
def process_metrics_restored() -> Iterator[None]:
    """LLMService registers the process's serving metrics in prometheus' default registry once;
    a service made here must not leave them behind for later tests of this process."""
    import trtllm_truss.serving.core as service_module

    had_metrics = service_module._METRICS is not None
    yield
    if not had_metrics and service_module._METRICS is not None:
        service_module._METRICS.unregister()
        service_module._METRICS = None


def test_tritonserver_exits_within_its_exit_timeout_after_the_service_stops(tmp_path: Path, process_metrics_restored) -> None:
    from trtllm_truss.fronts.service import LLMService

    service = LLMService(_truss_with(tmp_path))
    service.load()
    server = service._stack.server
    pid = server.pid
    try:
        answer = asyncio.run(service.predict({"prompt": "Once upon a time", "max_tokens": 4, "stream": False}))
        assert answer["text"]
    except BaseException:
        service.shutdown()
        raise
    exit_timeout_s = server._spec.exit_timeout_s  # what tritonserver was launched with
    started = time.monotonic()
    service.shutdown()
    stopped_after = time.monotonic() - started
    deadline = time.monotonic() + exit_timeout_s
    while _alive(pid) and time.monotonic() < deadline:  # stop() waits, but poll: no reliance on it
        time.sleep(0.1)
    assert not _alive(pid), f"tritonserver (pid {pid}) still runs {exit_timeout_s}s after the stop"
    log = "\n".join(server.log_tail(100_000))
    # Strict: the wait at the exit timeout was a request leaked by Triton's gRPC frontend when the
    # engine probe cancelled its stream right after the answer (trtllm_truss.engine.stream_end).
    assert EXIT_TIMEOUT_MESSAGE not in log, f"tritonserver waited out its exit timeout ({stopped_after:.1f}s)"
    assert "successfully unloaded 'tensorrt_llm'" in log
    assert stopped_after < exit_timeout_s, f"the stop took {stopped_after:.1f}s (exit timeout {exit_timeout_s}s)"
