"""The synthetic stand-in behaves as NVIDIA's engine does on the wire: one response per token per
step (never merged), several engine instances sharing max_batch_size, NVIDIA's `stop` contract
across instances. Real tritonserver, `tensorrt_llm` called directly with token ids."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import _plan, _serve
from engine_wire import Stream, engine_inputs, request_error
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.repository import render_repository

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.timeout(300), pytest.mark.alone]

STEP_MS = 20.0


@pytest.fixture(scope="module")
def two_instance_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    runtime = RuntimeConfig(
        preprocessing_instance_count=1,
        postprocessing_instance_count=1,
        pytorch={
            "device": "cpu",
            "num_threads": 1,
            "synthetic": {"step_time_ms": STEP_MS},
            "instance_count": 2,
            "sender_threads": 1,  # 2 crashed tritonserver now and then (docs/design.md)
        },
    )
    repository = render_repository(_plan(runtime, max_batch_size=16), tmp_path_factory.mktemp("faithful") / "model_repository")
    yield from _serve(repository)


def test_one_response_per_token_for_every_stream(two_instance_triton) -> None:
    stream = Stream(two_instance_triton.grpc_url)
    try:
        ids = {f"r{i}" for i in range(8)}
        for i, request_id in enumerate(sorted(ids)):
            stream.send(request_id, engine_inputs([300 + i, 301, 302], 24))
        responses = stream.collect(ids, timeout_s=60)
    finally:
        stream.close()
    for request_id, chunks in responses.items():
        assert len(chunks) == 24, (request_id, chunks)
        assert all(len(chunk) == 1 for chunk in chunks), (request_id, chunks)


def test_stop_reaches_the_instance_that_serves_the_request(two_instance_triton) -> None:
    """Eight long requests spread over two instances (8 slots each, so all run wherever Triton puts
    them); each `stop` is a separate request that Triton may hand to either instance: every
    generation still ends early."""
    stream = Stream(two_instance_triton.grpc_url)
    try:
        ids = {f"long{i}" for i in range(8)}
        for i, request_id in enumerate(sorted(ids)):
            stream.send(request_id, engine_inputs([400 + i], 250))  # 5 s each if nothing stops it
        first: set[str] = set()
        deadline = time.monotonic() + 30
        while first != ids:
            result, error = stream.events.get(timeout=max(0.01, deadline - time.monotonic()))
            assert error is None, error
            first.add(result.get_response().id)
        begin = time.monotonic()
        # On the same stream, as NVIDIA's inflight_batcher_llm_client does: each id then gets two
        # final responses, the stop's (empty) and the stopped generation's.
        for request_id in sorted(ids):
            stream.send(request_id, engine_inputs([1], 1, streaming=False, stop=True))
        finals = {request_id: 0 for request_id in ids}
        deadline = time.monotonic() + 10
        while any(count < 2 for count in finals.values()):
            result, error = stream.events.get(timeout=max(0.01, deadline - time.monotonic()))
            assert error is None, error.message()
            response = result.get_response()
            finals[response.id] += int(response.parameters["triton_final_response"].bool_param)
        assert time.monotonic() - begin < 3.5, finals
    finally:
        stream.close()


def test_stop_without_request_id_is_nvidias_error(two_instance_triton) -> None:
    error = request_error(two_instance_triton.grpc_url, engine_inputs([1], 1, streaming=False, stop=True), timeout_s=30)
    assert error is not None and "Trying to stop a request but request ID is not provided" in str(error)


def test_nvidia_metric_series_are_exported(two_instance_triton) -> None:
    """NVIDIA's nv_trt_llm_* families with NVIDIA's labels, summed over both instances."""
    import urllib.request

    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(two_instance_triton.metrics_url, timeout=5) as response:
            text = response.read().decode()
        line = next((l for l in text.splitlines() if l.startswith('nv_trt_llm_request_metrics{') and 'request_type="max"' in l), None)
        if line is not None or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert line is not None, text[:2000]
    assert 'model="tensorrt_llm"' in line and 'version="1"' in line
    assert float(line.rsplit(" ", 1)[1]) == 16  # 8 slots per instance, two instances
    for family, label in (
        ("nv_trt_llm_kv_cache_block_metrics", 'kv_cache_block_type="fraction"'),
        ("nv_trt_llm_general_metrics", 'general_type="iteration_counter"'),
    ):
        assert any(l.startswith(family + "{") and label in l for l in text.splitlines()), family

