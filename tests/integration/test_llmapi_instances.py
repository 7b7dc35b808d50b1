"""Our llmapi model as N Triton instances in front of one LLM host (issue 39), on a real tritonserver with the
LLM-API double (its executor in a worker process, the synthetic engine): one host and one executor worker
for every instance, NVIDIA's `stop` found whichever instance it reaches, cancellation freeing the LLM's slot,
and a killed executor failing every open stream and reading unhealthy."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import tritonclient.grpc as grpcclient
from engine_wire import Stream, engine_inputs
from truss_serving import poll

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.alone]

REPO_ROOT = Path(__file__).resolve().parents[2]
STEP_MS = 20


def _llmapi_server(tmp: Path, *, instances: int, max_batch_size: int) -> Iterator[object]:
    from conftest import _serve
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan
    from trtllm_truss.planning.probe import RuntimeFacts
    from trtllm_truss.repository import render_repository

    environ = {
        "TRTLLM_RUNTIME__BACKEND": "llmapi",
        "TRTLLM_RUNTIME__LLMAPI__INSTANCE_COUNT": str(instances),
        "TRTLLM_RUNTIME__PYTORCH__SYNTHETIC__STEP_TIME_MS": str(STEP_MS),
        "TRTLLM_BUILD__MAX_BATCH_SIZE": str(max_batch_size),
    }
    plan = make_plan(load_config(REPO_ROOT, environ=environ), RuntimeFacts(), artifacts_dir=tmp / "artifacts")
    assert plan.backend == "llmapi" and plan.llm_api_double
    yield from _serve(render_repository(plan, tmp / "model_repository"))


@pytest.fixture(scope="module")
def llmapi_two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    yield from _llmapi_server(tmp_path_factory.mktemp("llmapi_two"), instances=2, max_batch_size=4)


def _tree(server) -> list[psutil.Process]:
    return psutil.Process(server.pid).children(recursive=True)


def _named(processes: list[psutil.Process], needle: str) -> list[psutil.Process]:
    found = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE and any(needle in part for part in process.cmdline()):
                found.append(process)
        except psutil.Error:  # gone meanwhile
            continue
    return found


def _stream_tokens(url: str, ids: list[int], max_tokens: int, request_id: str, timeout_s: float = 60.0) -> list[list[int]]:
    stream = Stream(url)
    try:
        stream.send(request_id, engine_inputs(ids, max_tokens))
        return stream.collect({request_id}, timeout_s)[request_id]
    finally:
        stream.close()


def test_every_instance_is_a_client_of_one_llm_host_and_one_executor(llmapi_two) -> None:
    processes = _tree(llmapi_two)
    engine_stubs = [p for p in processes if "tensorrt_llm_0_" in " ".join(p.cmdline())]
    hosts = _named(processes, "tensorrt_llm_llmapi.llm_host")
    workers = _named(processes, "engine_standin.llmapi_executor")
    assert len(engine_stubs) == 2, [p.cmdline() for p in processes]
    assert len(hosts) == 1 and len(workers) == 1
    assert workers[0].ppid() == hosts[0].pid and hosts[0].ppid() in {p.pid for p in engine_stubs}
    # 8 streams at once over a batch of 4: each gets its tokens, streamed (one response per step, or a few steps
    # merged where the instance's sender fell behind: seen once beside a CI run).
    results: dict[str, list] = {}

    def one(i: int) -> None:
        results[str(i)] = _stream_tokens(llmapi_two.grpc_url, [1, 2, 3, 4 + i], 6, f"many-{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(results) == [str(i) for i in range(8)]
    for responses in results.values():
        assert sum(len(r) for r in responses) == 6 and len(responses) >= 2, responses


def test_nvidia_stop_ends_the_request_whichever_instance_it_reaches(llmapi_two) -> None:
    """NVIDIA's `stop` (same request id, `stop: true`) is its own Triton request, which any instance may
    take: the host finds the request among every instance's."""
    request_id = f"stop-{uuid.uuid4().hex[:8]}"
    stream = Stream(llmapi_two.grpc_url)
    try:
        stream.send(request_id, engine_inputs([5, 6, 7], 200))
        first = stream.events.get(timeout=30)
        assert first[1] is None
        started = time.monotonic()
        for _ in range(4):  # several stops: with two instances, at least one lands on the other one, likely all
            stopper = grpcclient.InferenceServerClient(llmapi_two.grpc_url)
            stopper.start_stream(callback=lambda result, error: None)
            stopper.async_stream_infer("tensorrt_llm", engine_inputs([5, 6, 7], 1, stop=True), request_id=request_id)
            stopper.stop_stream()
            stopper.close()
        collected = stream.collect({request_id}, timeout_s=30)[request_id]
        assert time.monotonic() - started < 200 * STEP_MS / 1000 / 2, "the stop did not end the request early"
        assert sum(len(r) for r in collected) + 1 < 200
    finally:
        stream.close()


def test_a_cancelled_stream_frees_its_slot_in_the_llm(llmapi_two) -> None:
    """Four long streams fill the batch of 4; cancelling them must free the LLM's slots: a new request then
    streams at once instead of waiting for the long ones (200 steps of 20 ms)."""
    stream = Stream(llmapi_two.grpc_url)
    ids = [f"long-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    for request_id in ids:
        stream.send(request_id, engine_inputs([9, 9, 9], 200))
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while seen != set(ids) and time.monotonic() < deadline:
        result, error = stream.events.get(timeout=30)
        assert error is None
        seen.add(result.get_response().id)
    stream.close()  # cancels the four gRPC requests
    started = time.monotonic()
    tokens = _stream_tokens(llmapi_two.grpc_url, [1, 2], 3, "after-cancel", timeout_s=30)
    assert sum(len(r) for r in tokens) == 3
    assert time.monotonic() - started < 2.0, "the new request waited for the cancelled ones"


def test_a_killed_executor_fails_every_open_stream_and_the_stack_serves_again(tmp_path: Path) -> None:
    """SIGKILL of the executor's worker: every open stream ends with an error naming it, the host ends, the
    instances end their stubs, and the supervisor restarts tritonserver with a new host (Triton starts no
    stub again), which then serves."""
    for server in _llmapi_server(tmp_path, instances=2, max_batch_size=4):
        try:
            worker = _named(_tree(server), "engine_standin.llmapi_executor")[0]
            restarts = server.restarts
            stream = Stream(server.grpc_url)
            ids = [f"open-{i}" for i in range(3)]
            for request_id in ids:
                stream.send(request_id, engine_inputs([3, 3, 3], 500))
            assert stream.events.get(timeout=30)[1] is None  # streaming
            os.kill(worker.pid, signal.SIGKILL)
            errors: list[str] = []
            deadline = time.monotonic() + 30
            while len(errors) < len(ids) and (left := deadline - time.monotonic()) > 0:
                try:
                    _, error = stream.events.get(timeout=left)
                except queue.Empty:
                    break  # the assertion below names what came
                if error is not None:
                    errors.append(error.message())
            stream.close()
            # the executor's own reason (the LLM's failure of each request), not only the host's "gone"
            assert len(errors) == len(ids) and all("the executor is gone" in message for message in errors), errors
            poll(lambda: server.restarts > restarts and server.ready(), 120, what="tritonserver restarted and ready")
            assert len(_named(_tree(server), "engine_standin.llmapi_executor")) == 1  # a new one
            assert sum(len(r) for r in _stream_tokens(server.grpc_url, [1, 2], 3, "after-restart")) == 3
        except BaseException:  # what the host and the stubs logged (INFO: not in pytest's captured log)
            print("\n".join(server.log_tail(300)))
            raise
